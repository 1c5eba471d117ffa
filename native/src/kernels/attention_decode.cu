// Paged decode attention for grouped-query heads: each row is one new token of one sequence,
// attending to kv_lens[row] cached keys. One kernel:
//   - a block serves G query heads that share one KV head (G = heads / kv_heads where that is 1-4,
//     else its largest divisor up to 4, where head size <= 128 and rows x heads fill the GPU twice
//     over; else 1): each K and V row is read once for the whole group. With few rows one head per
//     block is faster (more blocks share the chain of dependent loads: 8B batch 1, 256 keys, 8.0
//     against 15.5 us), with many the group is (8B 64 rows, 144 keys: 57 against 131 us;
//     test_decode_attention_latency, H200);
//   - a row's keys are cut into pieces of split_len (>= 256 keys, chosen from the row's kv_len
//     alone), so a long context spreads over many blocks;
//   - block (head group, row, z) takes pieces z, z + Z, ... (Z = gridDim.z: as many as one wave of
//     blocks holds, decode_attention_grid_splits), 8 warps x 32 keys at a time, and writes each
//     piece's (max, sum, unnormalized output) per head;
//   - the block that completes a (row, group)'s last piece, found with an atomic counter, merges
//     the pieces into out = softmax(q k^T * scale) v, fp32, in piece order. A row of one piece is
//     written directly.
// A piece's partial and the merge do not depend on Z, G or the other rows, so a row's output is
// bit-identical at any batch size. Decode is latency-bound at short contexts, so the code keeps
// the chain of dependent memory accesses short: before waiting for the previous kernel (rope), a
// block reads its row's metadata and block table (written by the host before the step) and
// prefetches its first piece of K and V into L2 (all written by earlier steps but the newest key,
// and L2 is coherent with rope's write of that one); rope triggers this launch before its own
// wait, so the prefetch overlaps the qkv GEMV (135M batch 1 +6 %, 8B unchanged); K and V loads
// are issued together. The grouped kernel runs at two blocks per SM (8B 64 rows x 144 keys 43.5
// against 57.3 us at one). The previous two-kernel pair lost its A/B by 8-54 % at batch 64 and
// was deleted (2026-12-03).
#include <algorithm>

#include "attention_common.cuh"
#include "../launch.cuh"

namespace hearth {

constexpr int kDecodeWarps = 8;
constexpr int kMinSplitLen = kDecodeWarps * 32;  // one chunk of 32 keys per warp
constexpr int kMaxGroup = 4;                      // query heads per block at most
// Blocks a multiprocessor holds: the kernels' launch bounds, and the grid's wave (grid_splits).
constexpr int kGroupedBlocksPerSm = 2, kOneHeadBlocksPerSm = 1;

// The piece length of a row: `split_len` when given (> 0), else chosen from the row's own kv_len
// (at least kMinSplitLen keys, at most max_splits pieces), so a captured graph needs no host-side
// length and a row's pieces do not depend on its batch.
__device__ __forceinline__ int row_split_len(int kv_len, int split_len, int max_splits) {
  if (split_len > 0) return split_len;
  const int s = ((kv_len + max_splits - 1) / max_splits + 31) / 32 * 32;
  return max(kMinSplitLen, s);
}

// Warm L2 (and the TLB) with one piece of K and V of KV head kvh; reads only what the host wrote.
template <int HD>
__device__ __forceinline__ void prefetch_piece(const PagedAttention& p, const int32_t* table,
                                               int kvh, int start, int end) {
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

// kBlocksPerSm 2 (the grouped kernel): registers capped at 128 (value loads in half groups, some
// spills at head size 128) so two blocks share an SM; 1 (one head per block): up to 255 registers.
template <int HD, int G, int kBlocksPerSm>
__global__ void __launch_bounds__(kDecodeWarps * 32, kBlocksPerSm)
decode_attention_kernel(PagedAttention p, int split_len_arg, int max_splits,
                        float* __restrict__ part_ml, float* __restrict__ part_acc,
                        int* __restrict__ counters) {
  // Metadata first: the host wrote it before the step, so it needs no wait.
  const int h0 = blockIdx.x * G, row = blockIdx.y;
  const int kv_len = p.kv_lens[row];
  const int split_len = row_split_len(kv_len, split_len_arg, max_splits);
  const int splits = (kv_len + split_len - 1) / split_len;
  if ((int)blockIdx.z >= splits) return;  // reads nothing an earlier kernel wrote, writes nothing
  const int kvh = h0 / (p.heads / p.kv_heads);
  const int32_t* table = p.block_tables + (size_t)p.row_table[row] * p.max_blocks;
  {
    const int start = blockIdx.z * split_len;
    prefetch_piece<HD>(p, table, kvh, start, min(kv_len, start + split_len));
  }
  pdl_wait();
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float q_smem[G * HD];
  __shared__ float m_smem[G][kDecodeWarps], l_smem[G][kDecodeWarps];
  __shared__ float acc_smem[G][kDecodeWarps][HD];
  __shared__ float piece_w[G][32];  // merge: each piece's weight exp(m_s - m)
  __shared__ float piece_l[G][32];
  __shared__ bool last_block;
  const float* q = p.q + ((size_t)row * p.heads + h0) * HD;  // the G heads' queries, adjacent
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) q_smem[i] = q[i];
  __syncthreads();
  const size_t head_row = (size_t)row * p.heads + h0;  // (row, first head of the group)
  float* out = p.out + head_row * HD;
  int mine = 0;
  for (int split = blockIdx.z; split < splits; split += gridDim.z, ++mine) {
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    SoftmaxState<HD> st[G];
    for (int key0 = start + warp * 32; key0 < end; key0 += kDecodeWarps * 32)
      fold_key_chunk_group<HD, G, kBlocksPerSm>(st, q_smem, table, p.block_size, p.kv_heads, kvh, p.k_cache,
                                  p.v_cache, key0, min(32, end - key0), p.scale);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (lane == 0) {
        m_smem[g][warp] = st[g].m;
        l_smem[g][warp] = st[g].l;
      }
#pragma unroll
      for (int r = 0; r < HD / 32; ++r) acc_smem[g][warp][lane + 32 * r] = st[g].acc[r];
    }
    __syncthreads();
    float m[G], inv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY;
      for (int w = 0; w < kDecodeWarps; ++w) m[g] = fmaxf(m[g], m_smem[g][w]);
      float l = 0.f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (l_smem[g][w] > 0.f) l += l_smem[g][w] * expf(m_smem[g][w] - m[g]);
      inv[g] = l > 0.f ? 1.f / l : 0.f;
      if (splits > 1 && threadIdx.x == 0) {
        const size_t part = (head_row + g) * max_splits + split;
        part_ml[part * 2] = m[g];
        part_ml[part * 2 + 1] = l;
      }
    }
    // One piece is the whole row: normalized and written directly. Else this piece's partial.
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
      const int g = i / HD, d = i % HD;
      float a = 0.f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (l_smem[g][w] > 0.f) a += acc_smem[g][w][d] * expf(m_smem[g][w] - m[g]);
      if (splits == 1)
        out[i] = a * inv[g];
      else
        part_acc[((head_row + g) * max_splits + split) * HD + d] = a;
    }
    if (splits == 1) return;
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
  if (threadIdx.x < G * splits) {  // every piece's (m, l) in one round trip
    const int g = threadIdx.x / splits, s = threadIdx.x % splits;
    const size_t part = (head_row + g) * max_splits + s;
    piece_w[g][s] = __ldcg(part_ml + part * 2);
    piece_l[g][s] = __ldcg(part_ml + part * 2 + 1);
  }
  __syncthreads();
  float mm[G], inv[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    mm[g] = -INFINITY;
    for (int s = 0; s < splits; ++s) mm[g] = fmaxf(mm[g], piece_w[g][s]);
    float ll = 0.f;
    for (int s = 0; s < splits; ++s) ll += piece_l[g][s] * expf(piece_w[g][s] - mm[g]);
    inv[g] = ll > 0.f ? 1.f / ll : 0.f;
  }
  __syncthreads();
  if (threadIdx.x < G * splits) {
    const int g = threadIdx.x / splits, s = threadIdx.x % splits;
    piece_w[g][s] = expf(piece_w[g][s] - mm[g]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    const float* acc = part_acc + (head_row + g) * max_splits * HD + d;
    float a = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) a += __ldcg(acc + s * HD) * piece_w[g][s];
    out[i] = a * inv[g];
  }
}

// The kernel of one head size for a group of 1-4 query heads (2-4 only up to head size 128).
template <int HD>
void launch_decode_attention_grouped(int group, dim3 grid, cudaStream_t stream,
                                     const PagedAttention& p, int split_len, int max_splits,
                                     float* partial_ml, float* partial_acc, int* counters) {
  auto launch = [&](auto kernel) {
    launch_pdl(kernel, grid, kDecodeWarps * 32, 0, stream, p, split_len, max_splits, partial_ml,
               partial_acc, counters);
  };
  if constexpr (HD <= 128) {
    if (group == 2) return launch(decode_attention_kernel<HD, 2, kGroupedBlocksPerSm>);
    if (group == 3) return launch(decode_attention_kernel<HD, 3, kGroupedBlocksPerSm>);
    if (group == 4) return launch(decode_attention_kernel<HD, 4, kGroupedBlocksPerSm>);
  }
  HEARTH_REQUIRE(group == 1, "decode_attention: unsupported head group");
  launch(decode_attention_kernel<HD, 1, kOneHeadBlocksPerSm>);
}

int decode_attention_group(int rows, int heads, int kv_heads, int head_dim) {
  const int sms = sm_count();
  if (head_dim > 128 || (long long)rows * heads < 2LL * sms) return 1;
  // The most heads (<= kMaxGroup) that evenly divide those sharing a KV head: Qwen3-30B-A3B's 8 go
  // in groups of 4, so each K and V row is read twice instead of eight times.
  const int sharing = heads / kv_heads;
  for (int g = std::min(sharing, kMaxGroup); g > 1; --g)
    if (sharing % g == 0) return g;
  return 1;
}

int decode_attention_grid_splits(int rows, int blocks_x, int group, int max_splits) {
  // As many blocks per (row, head group) as one wave holds beside the others (the one-head kernel
  // takes an SM: 163 registers at head size 128; the grouped kernel two), at least 1; more pieces
  // than blocks are walked by each block in turn. The rule before (about four blocks an SM, rounded
  // up to a power of two) launched 1,024 blocks at batch 1, nearly all empty at short contexts, and
  // at 4,096 keys queued its 512 working blocks in four rounds: one wave took 8B batch 1 at 4,096
  // keys from 40.3 to 33.9 us, the same at 256 keys (8.2 / 8.3) and at 64 rows x 144 keys (46.8;
  // H100, test_decode_attention_latency; docs/BENCHMARKS.md).
  const long long per_sm = group > 1 ? kGroupedBlocksPerSm : kOneHeadBlocksPerSm;
  const long long z = per_sm * sm_count() / ((long long)rows * blocks_x);
  return (int)std::max(1LL, std::min<long long>(z, max_splits));
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
  const int group = decode_attention_group(p.rows, p.heads, p.kv_heads, p.head_dim);
  const int blocks_x = p.heads / group;
  dim3 grid(blocks_x, p.rows, decode_attention_grid_splits(p.rows, blocks_x, group, max_splits));
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    launch_decode_attention_grouped<HD>(group, grid, stream, p, split_len, max_splits, partial_ml,
                                        partial_acc, counters);
    HEARTH_CHECK_LAUNCH("decode_attention_kernel");
  });
}

}  // namespace hearth
