// RMSNorm fused with the residual add: residual += delta (optional; each delta row times
// delta_row_scale[r] when the product that wrote it ran over a row-scaled operand), then
// y = residual * rsqrt(mean(residual^2) + eps) * weight. One block of 256 threads per row; the
// residual stream is fp32; y goes out as fp32 (the exact product's input, or a GEMV's) or as the
// fast product's fp16 operand y / out16_scale (out16_scale: a static power of two, kernels.h).
// The sum of squares is reduced in a fixed order, whatever the number of rows.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void rmsnorm_residual_kernel(float* __restrict__ residual, const float* __restrict__ delta,
                                        const float* __restrict__ delta_row_scale,
                                        const bf16* __restrict__ weight, float* __restrict__ out,
                                        f16* __restrict__ out16, float out16_inv_scale, int hidden,
                                        float eps) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const size_t base = (size_t)blockIdx.x * hidden;
  float* x = residual + base;
  const float dscale = delta_row_scale ? delta_row_scale[blockIdx.x] : 1.f;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) {
      v += delta[base + i] * dscale;
      x[i] = v;
    }
    sq += v * v;
  }
  const float total = block_sum(sq, scratch);
  const float inv = rsqrtf(total / (float)hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float y = x[i] * inv * __bfloat162float(weight[i]);
    if (out16)
      out16[base + i] = __float2half_rn(y * out16_inv_scale);
    else
      out[base + i] = y;
  }
}

void launch_rmsnorm_residual(float* residual, const float* delta, const bf16* weight, float* out,
                             int rows, int hidden, float eps, cudaStream_t stream,
                             const float* delta_row_scale, f16* out16, float out16_scale) {
  HEARTH_REQUIRE(rows >= 0 && hidden > 0, "rmsnorm: bad shape");
  HEARTH_REQUIRE((out != nullptr) != (out16 != nullptr), "rmsnorm: one output, fp32 or fp16");
  HEARTH_REQUIRE(out16_scale > 0.f, "rmsnorm: the fp16 operand's scale must be positive");
  if (rows == 0) return;
  launch_pdl(rmsnorm_residual_kernel, rows, 256, 0, stream, residual, delta, delta_row_scale,
             weight, out, out16, 1.f / out16_scale, hidden, eps);
  HEARTH_CHECK_LAUNCH("rmsnorm_residual_kernel");
}

}  // namespace hearth
