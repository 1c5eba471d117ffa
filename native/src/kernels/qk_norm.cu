// Per-head RMSNorm of queries or keys (Qwen3's q_norm / k_norm), in place on the fp32 qkv rows:
// x[r, col0 + h*hd + i] = x * rsqrt(mean over i of x^2 + eps) * weight[i]. One warp per (row, head).
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void head_rmsnorm_kernel(float* __restrict__ x, int rows, int row_stride, int col0,
                                    int heads, int head_dim, const bf16* __restrict__ weight,
                                    float eps) {
  pdl_wait();
  pdl_launch_dependents();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= rows * heads) return;
  const int r = warp / heads, h = warp % heads;
  float* v = x + (size_t)r * row_stride + col0 + (size_t)h * head_dim;
  float sq = 0.f;
  for (int i = lane; i < head_dim; i += 32) sq += v[i] * v[i];
  sq = warp_sum(sq);
  const float inv = rsqrtf(sq / (float)head_dim + eps);
  for (int i = lane; i < head_dim; i += 32) v[i] = v[i] * inv * __bfloat162float(weight[i]);
}

void launch_head_rmsnorm(float* x, int rows, int row_stride, int col0, int heads, int head_dim,
                         const bf16* weight, float eps, cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && heads > 0 && head_dim > 0 &&
                 col0 + heads * head_dim <= row_stride, "head_rmsnorm: bad shape");
  if (rows == 0) return;
  const int warps = rows * heads;
  const int threads = 256;
  const int blocks = (warps * 32 + threads - 1) / threads;
  launch_pdl(head_rmsnorm_kernel, blocks, threads, 0, stream, x, rows, row_stride, col0, heads,
             head_dim, weight, eps);
  HEARTH_CHECK_LAUNCH("head_rmsnorm_kernel");
}

}  // namespace hearth
