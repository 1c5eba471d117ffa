// Paged decode attention for grouped-query heads: each row is one new token of one sequence,
// attending to kv_lens[row] cached keys. One kernel:
//   - a row's keys are cut into pieces of split_len (>= 256 keys, chosen from the row's kv_len
//     alone), so a long context spreads over many blocks;
//   - block (head, row, z) takes pieces z, z + Z, ... (Z = gridDim.z, fewer when many rows x
//     heads already fill the GPU), 8 warps x 32 keys at a time, and writes each piece's (max,
//     sum, unnormalized output);
//   - the block that completes a (row, head)'s last piece, found with an atomic counter, merges
//     the pieces into out = softmax(q k^T * scale) v, fp32, in piece order. A row of one piece is
//     written directly.
// A piece's partial and the merge do not depend on Z or on the other rows, so a row's output is
// bit-identical at any batch size. Decode is latency-bound at short contexts, so the code keeps
// the chain of dependent memory accesses short: the value loads of a chunk are issued together,
// the merge reads all pieces' (m, l) at once.
// HEARTH_ATTN_PREFETCH=1 (opt-in, read per launch): before waiting for the previous kernel, each
// block reads its row's metadata and block table (written by the host before the step) and
// prefetches into L2 the K and V rows of its first piece (all written by earlier steps but the
// newest, and L2 is coherent with rope's write of that one); rope then lets this kernel launch
// before rope's own wait, so the prefetch overlaps the qkv GEMV. The arithmetic is unchanged.
// HEARTH_DECODE_ATTN=two-kernel (read per launch, so captured into the decode graphs at load):
// the previous round's pair (4 warps, pieces of >= 128 keys, a grid of max_splits pieces, then a
// merge kernel), kept to A/B the one-kernel version in one process (docs/PERF_NOTES.md).
#include <algorithm>

#include "attention_common.cuh"
#include "../env.h"
#include "../launch.cuh"

namespace hearth {

constexpr int kDecodeWarps = 8;
constexpr int kMinSplitLen = kDecodeWarps * 32;  // one chunk of 32 keys per warp

// The piece length of a row: `split_len` when given (> 0), else chosen from the row's own kv_len
// (at least kMinSplitLen keys, at most max_splits pieces), so a captured graph needs no host-side
// length and a row's pieces do not depend on its batch.
__device__ __forceinline__ int row_split_len(int kv_len, int split_len, int max_splits) {
  if (split_len > 0) return split_len;
  const int s = ((kv_len + max_splits - 1) / max_splits + 31) / 32 * 32;
  return max(kMinSplitLen, s);
}

// Warm L2 (and the TLB) with this block's first piece of K and V; reads only what the host wrote.
template <int HD>
__device__ __forceinline__ void prefetch_first_piece(const PagedAttention& p, int split_len_arg,
                                                     int max_splits) {
  const int row = blockIdx.y;
  const int kv_len = p.kv_lens[row];
  const int split_len = row_split_len(kv_len, split_len_arg, max_splits);
  const int start = blockIdx.z * split_len;
  if (start >= kv_len) return;
  const int end = min(kv_len, start + split_len);
  const int32_t* table = p.block_tables + (size_t)p.row_table[row] * p.max_blocks;
  const int kvh = blockIdx.x / (p.heads / p.kv_heads);
  constexpr int kLines = (HD * 2 + 127) / 128;  // 128-byte lines per K or V row
  for (int key = start + threadIdx.x; key < end; key += blockDim.x) {
    const size_t offset = (cache_slot(table, p.block_size, key) * p.kv_heads + kvh) * HD;
#pragma unroll
    for (int i = 0; i < kLines; ++i) {
      prefetch_l2(p.k_cache + offset + i * 64);
      prefetch_l2(p.v_cache + offset + i * 64);
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kDecodeWarps * 32)
decode_attention_kernel(PagedAttention p, int split_len_arg, int max_splits,
                        float* __restrict__ part_ml, float* __restrict__ part_acc,
                        int* __restrict__ counters, int prefetch) {
  if (prefetch) prefetch_first_piece<HD>(p, split_len_arg, max_splits);
  pdl_wait();
  pdl_launch_dependents();
  const int h = blockIdx.x, row = blockIdx.y;
  const int kv_len = p.kv_lens[row];
  const int table_row = p.row_table[row];
  const int split_len = row_split_len(kv_len, split_len_arg, max_splits);
  const int splits = (kv_len + split_len - 1) / split_len;
  if ((int)blockIdx.z >= splits) return;
  const int kvh = h / (p.heads / p.kv_heads);
  const int32_t* table = p.block_tables + (size_t)table_row * p.max_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float q_smem[HD];
  __shared__ float m_smem[kDecodeWarps], l_smem[kDecodeWarps];
  __shared__ float acc_smem[kDecodeWarps][HD];
  __shared__ float piece_w[32];  // merge: each piece's weight exp(m_s - m)
  __shared__ float piece_l[32];
  __shared__ bool last_block;
  const float* q = p.q + ((size_t)row * p.heads + h) * HD;
  for (int i = threadIdx.x; i < HD; i += blockDim.x) q_smem[i] = q[i];
  __syncthreads();
  const size_t head_row = (size_t)row * p.heads + h;
  float* out = p.out + head_row * HD;
  const size_t base = head_row * max_splits;
  int mine = 0;
  for (int split = blockIdx.z; split < splits; split += gridDim.z, ++mine) {
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
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
    // One piece is the whole row: normalized and written directly. Else this piece's partial.
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const size_t part = base + split;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
      float a = 0.f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (l_smem[w] > 0.f) a += acc_smem[w][d] * expf(m_smem[w] - m);
      if (splits == 1)
        out[d] = a * inv;
      else
        part_acc[part * HD + d] = a;
    }
    if (splits == 1) return;
    if (threadIdx.x == 0) {
      part_ml[part * 2] = m;
      part_ml[part * 2 + 1] = l;
    }
    __syncthreads();  // m_smem / acc_smem are reused by the next piece
  }
  // Publish this block's pieces, then count them; the block that completes the count merges (and
  // re-arms the counter for the next launch).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&counters[head_row], mine) + mine;
    last_block = done == splits;
    if (last_block) counters[head_row] = 0;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  if (threadIdx.x < splits) {  // every piece's (m, l) in one round trip
    piece_w[threadIdx.x] = __ldcg(part_ml + (base + threadIdx.x) * 2);
    piece_l[threadIdx.x] = __ldcg(part_ml + (base + threadIdx.x) * 2 + 1);
  }
  __syncthreads();
  float mm = -INFINITY;
  for (int s = 0; s < splits; ++s) mm = fmaxf(mm, piece_w[s]);
  float ll = 0.f;
  for (int s = 0; s < splits; ++s) ll += piece_l[s] * expf(piece_w[s] - mm);
  __syncthreads();
  if (threadIdx.x < splits) piece_w[threadIdx.x] = expf(piece_w[threadIdx.x] - mm);
  __syncthreads();
  const float inv = ll > 0.f ? 1.f / ll : 0.f;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) a += __ldcg(part_acc + (base + s) * HD + d) * piece_w[s];
    out[d] = a * inv;
  }
}

// ---- the previous round's two-kernel pair (HEARTH_DECODE_ATTN=two-kernel) ----
namespace two_kernel {

constexpr int kWarps = 4;

__device__ __forceinline__ int row_split_len(int kv_len, int split_len, int max_splits) {
  if (split_len > 0) return split_len;
  const int s = ((kv_len + max_splits - 1) / max_splits + 31) / 32 * 32;
  return max(128, s);
}

template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
split_kernel(PagedAttention p, int split_len, int max_splits, float* __restrict__ part_ml,
             float* __restrict__ part_acc) {
  pdl_wait();
  pdl_launch_dependents();
  const int h = blockIdx.x, row = blockIdx.y, split = blockIdx.z;
  const int kv_len = p.kv_lens[row];
  split_len = row_split_len(kv_len, split_len, max_splits);
  const int start = split * split_len;
  if (start >= kv_len) return;
  const int end = min(kv_len, start + split_len);
  const int kvh = h / (p.heads / p.kv_heads);
  const int32_t* table = p.block_tables + (size_t)p.row_table[row] * p.max_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float q_smem[HD];
  __shared__ float m_smem[kWarps], l_smem[kWarps];
  __shared__ float acc_smem[kWarps][HD];
  const float* q = p.q + ((size_t)row * p.heads + h) * HD;
  for (int i = threadIdx.x; i < HD; i += blockDim.x) q_smem[i] = q[i];
  __syncthreads();
  SoftmaxState<HD> st;
  for (int key0 = start + warp * 32; key0 < end; key0 += kWarps * 32)
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
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, m_smem[w]);
  const size_t part = ((size_t)row * p.heads + h) * max_splits + split;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (l_smem[w] > 0.f) a += acc_smem[w][d] * expf(m_smem[w] - m);
    part_acc[part * HD + d] = a;
  }
  if (threadIdx.x == 0) {
    float l = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (l_smem[w] > 0.f) l += l_smem[w] * expf(m_smem[w] - m);
    part_ml[part * 2] = m;
    part_ml[part * 2 + 1] = l;
  }
}

template <int HD>
__global__ void merge_kernel(PagedAttention p, int split_len, int max_splits,
                             const float* __restrict__ part_ml, const float* __restrict__ part_acc) {
  pdl_wait();
  pdl_launch_dependents();
  const int h = blockIdx.x, row = blockIdx.y;
  const int kv_len = p.kv_lens[row];
  split_len = row_split_len(kv_len, split_len, max_splits);
  const int splits = (kv_len + split_len - 1) / split_len;
  const size_t base = ((size_t)row * p.heads + h) * max_splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, part_ml[(base + s) * 2]);
  float l = 0.f;
  for (int s = 0; s < splits; ++s) l += part_ml[(base + s) * 2 + 1] * expf(part_ml[(base + s) * 2] - m);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* out = p.out + ((size_t)row * p.heads + h) * HD;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < splits; ++s)
      a += part_acc[(base + s) * HD + d] * expf(part_ml[(base + s) * 2] - m);
    out[d] = a * inv;
  }
}

}  // namespace two_kernel

bool decode_attention_prefetch() { return env_is("HEARTH_ATTN_PREFETCH", "1"); }

bool decode_attention_two_kernel() { return env_is("HEARTH_DECODE_ATTN", "two-kernel"); }

int decode_attention_grid_splits(int rows, int heads, int max_splits) {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount, 132);  // one GPU
  // About four blocks per SM in all; more pieces than blocks are walked by each block in turn.
  const long long want = (4LL * sms + (long long)rows * heads - 1) / ((long long)rows * heads);
  int z = 1;
  while (z < want && z < max_splits) z *= 2;
  return std::min(z, max_splits);
}

void launch_decode_attention(const PagedAttention& p, int split_len, int max_splits,
                             float* partial_ml, float* partial_acc, int* counters,
                             cudaStream_t stream) {
  HEARTH_REQUIRE(p.rows >= 0 && p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0,
                 "decode_attention: heads must be a multiple of kv_heads");
  HEARTH_REQUIRE(split_len >= 0 && split_len % 32 == 0 && max_splits > 0 && max_splits <= 32,
                 "decode_attention: split_len must be 0 (per row) or a positive multiple of 32, "
                 "max_splits 1..32");
  if (p.rows == 0) return;
  if (decode_attention_two_kernel()) {
    HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
      launch_pdl(two_kernel::split_kernel<HD>, dim3(p.heads, p.rows, max_splits),
                 two_kernel::kWarps * 32, 0, stream, p, split_len, max_splits, partial_ml,
                 partial_acc);
      HEARTH_CHECK_LAUNCH("decode_attention two_kernel::split_kernel");
      launch_pdl(two_kernel::merge_kernel<HD>, dim3(p.heads, p.rows), HD, 0, stream, p, split_len,
                 max_splits, (const float*)partial_ml, (const float*)partial_acc);
      HEARTH_CHECK_LAUNCH("decode_attention two_kernel::merge_kernel");
    });
    return;
  }
  dim3 grid(p.heads, p.rows, decode_attention_grid_splits(p.rows, p.heads, max_splits));
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    launch_pdl(decode_attention_kernel<HD>, grid, kDecodeWarps * 32, 0, stream, p, split_len,
               max_splits, partial_ml, partial_acc, counters, decode_attention_prefetch() ? 1 : 0);
    HEARTH_CHECK_LAUNCH("decode_attention_kernel");
  });
}

}  // namespace hearth
