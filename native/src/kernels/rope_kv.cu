// Rotary position embedding fused with the KV-cache write (rope.cuh): for each token, each query
// head is rotated into q_out (fp32) and each key head rotated and written, with its value, as bf16
// into the paged cache at the token's slot. At <= 4 decode rows the qkv GEMV does this in its
// epilogue instead (launch_gemv_rope), with the same rope_store.
#include "rope.cuh"
#include "../launch.cuh"

namespace hearth {

__global__ void rope_kv_write_kernel(const float* __restrict__ qkv, RopeTarget target) {
  // The next kernel (decode attention) may launch before this one waits, so its prefetch
  // overlaps the qkv GEMV; it still waits for this kernel's end.
  pdl_launch_dependents();
  pdl_wait();
  const int t = blockIdx.x;
  const int h = blockIdx.y;  // 0..heads-1 query heads, then kv_heads key heads, then kv_heads values
  const int half = target.head_dim >> 1;
  const int row_width = (target.heads + 2 * target.kv_heads) * target.head_dim;
  const float* src = qkv + (size_t)t * row_width + (size_t)h * target.head_dim;
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_store(target, t, h, i, src[i], src[i + half]);
}

void launch_rope_kv_write(const float* qkv, int tokens, const RopeTarget& target, cudaStream_t stream) {
  const int heads = target.heads, kv_heads = target.kv_heads, head_dim = target.head_dim;
  HEARTH_REQUIRE(tokens >= 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "rope_kv_write: bad shape");
  if (tokens == 0) return;
  dim3 grid(tokens, heads + 2 * kv_heads);
  const int threads = head_dim / 2 < 128 ? ((head_dim / 2 + 31) / 32) * 32 : 128;
  launch_pdl(rope_kv_write_kernel, grid, threads, 0, stream, qkv, target);
  HEARTH_CHECK_LAUNCH("rope_kv_write_kernel");
}

}  // namespace hearth
