// Paged decode attention for grouped-query heads: each row is one new token of one sequence,
// attending to kv_lens[row] cached keys. The keys are split into pieces of `split_len` so a long
// context spreads over many blocks. One kernel: each piece's block writes its (max, sum,
// unnormalized output); the last block of a (row, head) to finish, found with an atomic counter,
// merges the pieces into out = softmax(q k^T * scale) v, fp32, in split order (so the result does
// not depend on which block came last). A row with one piece writes its output directly. Blocks
// past a row's last piece exit at once.
#include "attention_common.cuh"
#include "../launch.cuh"

namespace hearth {

constexpr int kDecodeWarps = 4;

// The piece length of a row: `split_len` when given (> 0), else chosen from the row's own kv_len
// (at least 128 keys, at most max_splits pieces), so a row's result does not depend on which other
// rows share the launch, and a captured graph needs no host-side length.
__device__ __forceinline__ int row_split_len(int kv_len, int split_len, int max_splits) {
  if (split_len > 0) return split_len;
  const int s = ((kv_len + max_splits - 1) / max_splits + 31) / 32 * 32;
  return max(128, s);
}

template <int HD>
__global__ void __launch_bounds__(kDecodeWarps * 32)
decode_attention_kernel(PagedAttention p, int split_len, int max_splits,
                        float* __restrict__ part_ml, float* __restrict__ part_acc,
                        int* __restrict__ counters) {
  pdl_wait();
  pdl_launch_dependents();
  const int h = blockIdx.x, row = blockIdx.y, split = blockIdx.z;
  const int kv_len = p.kv_lens[row];
  split_len = row_split_len(kv_len, split_len, max_splits);
  const int splits = (kv_len + split_len - 1) / split_len;
  if (split >= splits) return;
  const int start = split * split_len;
  const int end = min(kv_len, start + split_len);
  const int kvh = h / (p.heads / p.kv_heads);
  const int32_t* table = p.block_tables + (size_t)p.row_table[row] * p.max_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float q_smem[HD];
  __shared__ float m_smem[kDecodeWarps], l_smem[kDecodeWarps];
  __shared__ float acc_smem[kDecodeWarps][HD];
  __shared__ bool last_block;
  const float* q = p.q + ((size_t)row * p.heads + h) * HD;
  for (int i = threadIdx.x; i < HD; i += blockDim.x) q_smem[i] = q[i];
  __syncthreads();
  SoftmaxState<HD> st;
  for (int key0 = start + warp * 32; key0 < end; key0 += kDecodeWarps * 32)
    fold_key_chunk<HD>(st, q_smem, table, p.block_size, p.kv_heads, kvh, p.k_cache, p.v_cache,
                       key0, min(32, end - key0), p.scale);
  if (lane == 0) {
    m_smem[warp] = st.m;
    l_smem[warp] = st.l;
  }
#pragma unroll
  for (int r = 0; r < HD / 32; ++r) acc_smem[warp][lane + 32 * r] = st.acc[r];
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, m_smem[w]);
  float l = 0.f;
  for (int w = 0; w < kDecodeWarps; ++w)
    if (l_smem[w] > 0.f) l += l_smem[w] * expf(m_smem[w] - m);
  const size_t head_row = (size_t)row * p.heads + h;
  float* out = p.out + head_row * HD;
  if (splits == 1) {  // the whole row in this block: the merge of one piece, written directly
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
      float a = 0.f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (l_smem[w] > 0.f) a += acc_smem[w][d] * expf(m_smem[w] - m);
      out[d] = a * inv;
    }
    return;
  }
  const size_t base = head_row * max_splits;
  const size_t part = base + split;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < kDecodeWarps; ++w)
      if (l_smem[w] > 0.f) a += acc_smem[w][d] * expf(m_smem[w] - m);
    part_acc[part * HD + d] = a;
  }
  if (threadIdx.x == 0) {
    part_ml[part * 2] = m;
    part_ml[part * 2 + 1] = l;
  }
  // Publish this piece, then count it; the block that counts last merges (and re-arms the counter
  // for the next launch).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&counters[head_row], 1);
    last_block = done == splits - 1;
    if (last_block) counters[head_row] = 0;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  float mm = -INFINITY;
  for (int s = 0; s < splits; ++s) mm = fmaxf(mm, __ldcg(part_ml + (base + s) * 2));
  float ll = 0.f;
  for (int s = 0; s < splits; ++s)
    ll += __ldcg(part_ml + (base + s) * 2 + 1) * expf(__ldcg(part_ml + (base + s) * 2) - mm);
  const float inv = ll > 0.f ? 1.f / ll : 0.f;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < splits; ++s)
      a += __ldcg(part_acc + (base + s) * HD + d) * expf(__ldcg(part_ml + (base + s) * 2) - mm);
    out[d] = a * inv;
  }
}

void launch_decode_attention(const PagedAttention& p, int split_len, int max_splits,
                             float* partial_ml, float* partial_acc, int* counters,
                             cudaStream_t stream) {
  HEARTH_REQUIRE(p.rows >= 0 && p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0,
                 "decode_attention: heads must be a multiple of kv_heads");
  HEARTH_REQUIRE(split_len >= 0 && split_len % 32 == 0 && max_splits > 0,
                 "decode_attention: split_len must be 0 (per row) or a positive multiple of 32");
  if (p.rows == 0) return;
  dim3 grid(p.heads, p.rows, max_splits);
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    launch_pdl(decode_attention_kernel<HD>, grid, kDecodeWarps * 32, 0, stream, p, split_len,
               max_splits, partial_ml, partial_acc, counters);
    HEARTH_CHECK_LAUNCH("decode_attention_kernel");
  });
}

}  // namespace hearth
