// Causal prefill attention over the paged cache: a chunk of prompt tokens (already written to the
// cache by rope_kv) each attends to the kv_lens[row] = position + 1 keys before and including it.
// One warp per (query row, head), eight rows per block; out = softmax(q k^T * scale) v, fp32.
#include "attention_common.cuh"

namespace hearth {

constexpr int kPrefillRowsPerBlock = 8;

template <int HD>
__global__ void __launch_bounds__(kPrefillRowsPerBlock * 32)
prefill_attention_kernel(PagedAttention p) {
  const int h = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.y * kPrefillRowsPerBlock + warp;
  __shared__ float q_smem[kPrefillRowsPerBlock][HD];
  if (row >= p.rows) return;  // whole warp leaves; no block-wide barrier follows
  const float* q = p.q + ((size_t)row * p.heads + h) * HD;
  for (int i = lane; i < HD; i += 32) q_smem[warp][i] = q[i];
  __syncwarp();
  const int kv_len = p.kv_lens[row];
  const int kvh = h / (p.heads / p.kv_heads);
  const int32_t* table = p.block_tables + (size_t)p.row_table[row] * p.max_blocks;
  SoftmaxState<HD> st;
  for (int key0 = 0; key0 < kv_len; key0 += 32)
    fold_key_chunk<HD>(st, q_smem[warp], table, p.block_size, p.kv_heads, kvh, p.k_cache,
                       p.v_cache, key0, min(32, kv_len - key0), p.scale);
  const float inv = st.l > 0.f ? 1.f / st.l : 0.f;
  float* out = p.out + ((size_t)row * p.heads + h) * HD;
#pragma unroll
  for (int r = 0; r < HD / 32; ++r) out[lane + 32 * r] = st.acc[r] * inv;
}

void launch_prefill_attention(const PagedAttention& p, cudaStream_t stream) {
  HEARTH_REQUIRE(p.rows >= 0 && p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0,
                 "prefill_attention: heads must be a multiple of kv_heads");
  if (p.rows == 0) return;
  dim3 grid(p.heads, (p.rows + kPrefillRowsPerBlock - 1) / kPrefillRowsPerBlock);
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    prefill_attention_kernel<HD><<<grid, kPrefillRowsPerBlock * 32, 0, stream>>>(p);
    HEARTH_CHECK_LAUNCH("prefill_attention_kernel");
  });
}

}  // namespace hearth
