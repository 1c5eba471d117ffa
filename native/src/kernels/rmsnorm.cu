// RMSNorm fused with the residual add: residual += delta (optional), then
// out = residual * rsqrt(mean(residual^2) + eps) * weight. One block per row; the residual stream
// and the normalized output (input of the next matrix product) are fp32.
// For the stacked decode GEMM (buckets of 16+) two more fusions: delta may come as the two halves
// of a stacked product (delta + delta_lo, the sum add_halves_kernel would have written), and the
// output may go out as the product's bf16 hi / lo operand (split_kernel's arithmetic), so neither
// the add-halves nor the split kernel runs. The values are the same bits as without them.
// A row is one block of 256 threads. At decode's 16-64 rows the kernel is latency-bound (8B, 64
// rows: 12.5 us per call, 10 % of the step, profile_decode 2026-12-03), so 1,024 threads per row
// (each thread a few elements) should be faster: HEARTH_RMSNORM_THREADS=1024 (read per launch),
// opt-in until measured on a GPU. The sum of squares is reduced in a fixed order for a given
// width, whatever the number of rows.
#include "../common.cuh"
#include "../env.h"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void rmsnorm_residual_kernel(float* __restrict__ residual, const float* __restrict__ delta,
                                        const float* __restrict__ delta_lo,
                                        const bf16* __restrict__ weight, float* __restrict__ out,
                                        bf16* __restrict__ out_hi, bf16* __restrict__ out_lo,
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
      v += delta_lo ? delta[base + i] + delta_lo[base + i] : delta[base + i];
      x[i] = v;
    }
    sq += v * v;
  }
  const float total = block_sum(sq, scratch);
  const float inv = rsqrtf(total / (float)hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    store_operand(out, out_hi, out_lo, base + i, x[i] * inv * __bfloat162float(weight[i]));
}

void launch_rmsnorm_residual(float* residual, const float* delta, const bf16* weight, float* out,
                             int rows, int hidden, float eps, cudaStream_t stream,
                             const float* delta_lo, bf16* out_hi, bf16* out_lo) {
  HEARTH_REQUIRE(rows >= 0 && hidden > 0, "rmsnorm: bad shape");
  HEARTH_REQUIRE((out != nullptr) != (out_hi != nullptr && out_lo != nullptr),
                 "rmsnorm: one output, fp32 or bf16 hi / lo");
  if (rows == 0) return;
  const int threads = env_is("HEARTH_RMSNORM_THREADS", "1024") ? 1024 : 256;
  launch_pdl(rmsnorm_residual_kernel, rows, threads, 0, stream, residual, delta, delta_lo, weight, out,
             out_hi, out_lo, hidden, eps);
  HEARTH_CHECK_LAUNCH("rmsnorm_residual_kernel");
}

}  // namespace hearth
