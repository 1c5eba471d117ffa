// Rotary position embedding fused with the KV-cache write (rope.cuh): for each token, each query
// head is rotated into q_out (fp32) and each key head rotated and written, with its value, as bf16
// into the paged cache at the token's slot. Qwen3's per-head q / k RMSNorm runs here too (one block
// is one head), two kernels fewer a layer than normalizing first. At <= 4 decode rows the qkv GEMV
// does this in its epilogue instead (launch_gemv_rope, models without head norms), with the same
// rope_store.
#include "rope.cuh"
#include "../launch.cuh"

namespace hearth {

__global__ void rope_kv_write_kernel(const float* __restrict__ qkv, RopeTarget target, HeadNorm norm) {
  // The next kernel (decode attention) may launch before this one waits, so its prefetch
  // overlaps the qkv GEMV; it still waits for this kernel's end.
  pdl_launch_dependents();
  pdl_wait();
  const int t = blockIdx.x;
  const int h = blockIdx.y;  // 0..heads-1 query heads, then kv_heads key heads, then kv_heads values
  const int half = target.head_dim >> 1;
  const int row_width = (target.heads + 2 * target.kv_heads) * target.head_dim;
  const float* src = qkv + (size_t)t * row_width + (size_t)h * target.head_dim;
  // A query or key head's RMSNorm (the block is one head: uniform branch, block_sum inside); values
  // and models without head norms have no weight here.
  const bf16* nw = h < target.heads ? norm.q : h < target.heads + target.kv_heads ? norm.k : nullptr;
  float inv = 1.f;
  if (nw) {
    __shared__ float scratch[32];
    float sq = 0.f;
    for (int i = threadIdx.x; i < half; i += blockDim.x) sq += src[i] * src[i] + src[i + half] * src[i + half];
    inv = rsqrtf(block_sum(sq, scratch) / (float)target.head_dim + norm.eps);
  }
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float x1 = src[i], x2 = src[i + half];
    if (nw) x1 *= inv * __bfloat162float(nw[i]), x2 *= inv * __bfloat162float(nw[i + half]);
    rope_store(target, t, h, i, x1, x2);
  }
}

void launch_rope_kv_write(const float* qkv, int tokens, const RopeTarget& target, cudaStream_t stream,
                          const HeadNorm& norm) {
  const int heads = target.heads, kv_heads = target.kv_heads, head_dim = target.head_dim;
  HEARTH_REQUIRE(tokens >= 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "rope_kv_write: bad shape");
  HEARTH_REQUIRE(!norm.q == !norm.k, "rope_kv_write: a head norm needs both the query and the key weights");
  if (tokens == 0) return;
  dim3 grid(tokens, heads + 2 * kv_heads);
  const int threads = head_dim / 2 < 128 ? ((head_dim / 2 + 31) / 32) * 32 : 128;
  launch_pdl(rope_kv_write_kernel, grid, threads, 0, stream, qkv, target, norm);
  HEARTH_CHECK_LAUNCH("rope_kv_write_kernel");
}

}  // namespace hearth
