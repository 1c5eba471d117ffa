// RMSNorm fused with the residual add: residual += delta (optional), then
// out = residual * rsqrt(mean(residual^2) + eps) * weight. One block per row; the residual stream
// and the normalized output (input of the next matrix product) are fp32.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void rmsnorm_residual_kernel(float* __restrict__ residual, const float* __restrict__ delta,
                                        const bf16* __restrict__ weight, float* __restrict__ out,
                                        int hidden, float eps) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const size_t base = (size_t)blockIdx.x * hidden;
  float* x = residual + base;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) {
      v += delta[base + i];
      x[i] = v;
    }
    sq += v * v;
  }
  const float total = block_sum(sq, scratch);
  const float inv = rsqrtf(total / (float)hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    out[base + i] = x[i] * inv * __bfloat162float(weight[i]);
}

void launch_rmsnorm_residual(float* residual, const float* delta, const bf16* weight, float* out,
                             int rows, int hidden, float eps, cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && hidden > 0, "rmsnorm: bad shape");
  if (rows == 0) return;
  launch_pdl(rmsnorm_residual_kernel, rows, 256, 0, stream, residual, delta, weight, out, hidden, eps);
  HEARTH_CHECK_LAUNCH("rmsnorm_residual_kernel");
}

}  // namespace hearth
