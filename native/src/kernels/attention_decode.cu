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
//     blocks holds), 8 chunk states of 32 keys at a time, and writes each piece's (max, sum,
//     unnormalized output) per head;
//   - the block that completes a (row, group)'s last piece, found with an atomic counter, merges
//     the pieces into out = softmax(q k^T * scale) v, fp32, in piece order. A row of one piece is
//     written directly.
// A warp copies its chunk's 32 K rows and 32 V rows into shared memory with cp.async (16 lanes a
// row, coalesced: one round trip for all of them), then lane j scores key j and every lane sums its
// dims over the values from there (the staged kernel). It replaced (2026-12-08, H100) a kernel that
// held a lane's key row in registers and loaded values in serial groups of 8-16 keys: 8B 64 rows x
// 265 keys 89.7 -> 66.1 us, the 8B NVFP4 batch-64 step 10,455 -> 9,601 us, batch 1 (one head a
// block) 2,976 -> 2,947 us (attention 367 -> 314 us a step). The grouped heads run 4 warps a block
// (two blocks an SM; 8 warps at one: 89.0 us), one head 8 warps; that one remains for head size
// 256 and GPUs whose shared memory cannot hold the staging (decode_attention_kernel).
// A piece's partial and the merge do not depend on Z, G, the kernel or the other rows, so a row's
// output is bit-identical at any batch size (tested). Decode is latency-bound at short contexts,
// so before waiting for the previous kernel (rope) a block reads its row's metadata and block
// table (written by the host before the step) and prefetches its first piece of K and V into L2
// (all written by earlier steps but the newest key, and L2 is coherent with rope's write of that
// one); rope triggers this launch before its own wait, so the prefetch overlaps the qkv GEMV.
#include <algorithm>

#include "attention_common.cuh"
#include "cp_async.cuh"
#include "../launch.cuh"

namespace hearth {

constexpr int kDecodeWarps = 8;
constexpr int kMinSplitLen = kDecodeWarps * 32;  // one chunk of 32 keys per warp
constexpr int kMaxGroup = 4;                      // query heads per block at most
// Warps a block of the staged kernel: the grouped heads 4 (two blocks an SM), one head 8.
constexpr int kGroupedWarps = 4, kOneHeadWarps = 8;

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

// A decode block's row, head group, KV head and pieces, from metadata the host wrote before the
// step (no wait needed); its first piece of K and V is prefetched into L2 before it waits for the
// previous kernel (rope), then its G queries go to q_smem. False: the block has no piece (z past
// the row's pieces) and has read nothing an earlier kernel wrote.
struct DecodeBlock {
  int h0, row, kv_len, split_len, splits, kvh;
  const int32_t* table;
};

template <int HD, int G>
__device__ __forceinline__ bool start_decode_block(const PagedAttention& p, int split_len_arg, int max_splits,
                                                   float* q_smem, DecodeBlock& b) {
  b.h0 = blockIdx.x * G;
  b.row = blockIdx.y;
  b.kv_len = p.kv_lens[b.row];
  b.split_len = row_split_len(b.kv_len, split_len_arg, max_splits);
  b.splits = (b.kv_len + b.split_len - 1) / b.split_len;
  if ((int)blockIdx.z >= b.splits) return false;
  b.kvh = b.h0 / (p.heads / p.kv_heads);
  b.table = p.block_tables + (size_t)p.row_table[b.row] * p.max_blocks;
  const int start = blockIdx.z * b.split_len;
  prefetch_piece<HD>(p, b.table, b.kvh, start, min(b.kv_len, start + b.split_len));
  pdl_wait();
  pdl_launch_dependents();
  const float* q = p.q + ((size_t)b.row * p.heads + b.h0) * HD;  // the G heads' queries, adjacent
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) q_smem[i] = q[i];
  __syncthreads();
  return true;
}

// The block's per-warp states of one piece are in m_smem / l_smem / acc_smem (after a barrier):
// merged in warp order into the piece's (max, sum, output). A row of one piece is normalized and
// written to out; else the piece's partial goes to part_ml / part_acc for merge_pieces. Returns
// true where the row was written. Every decode kernel ends a piece here, so a piece's bits do not
// depend on which kernel folded it.
template <int HD, int G>
__device__ __forceinline__ bool store_piece(const float (*m_smem)[kDecodeWarps],
                                            const float (*l_smem)[kDecodeWarps],
                                            const float (*acc_smem)[kDecodeWarps][HD], int split,
                                            int splits, int max_splits, size_t head_row,
                                            float* __restrict__ out, float* __restrict__ part_ml,
                                            float* __restrict__ part_acc) {
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
  return splits == 1;
}

// After a block stored its `mine` pieces of (row, head group) head_row: publish them and count;
// the block that completes the count merges every piece, in piece order, into out (and re-arms
// the counter for the next launch).
template <int HD, int G>
__device__ __forceinline__ void merge_pieces(int mine, int splits, int max_splits, size_t head_row,
                                             float* __restrict__ out, const float* part_ml,
                                             const float* part_acc, int* __restrict__ counters) {
  __shared__ float piece_w[G][32];  // each piece's weight exp(m_s - m)
  __shared__ float piece_l[G][32];
  __shared__ bool last_block;
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

// One head a block with a lane's key row in registers: head size 256, and GPUs whose shared memory
// cannot hold the staged kernel's chunks.
template <int HD>
__global__ void __launch_bounds__(kDecodeWarps * 32, 1)
decode_attention_kernel(PagedAttention p, int split_len_arg, int max_splits,
                        float* __restrict__ part_ml, float* __restrict__ part_acc,
                        int* __restrict__ counters) {
  constexpr int G = 1;
  __shared__ float q_smem[G * HD];
  __shared__ float m_smem[G][kDecodeWarps], l_smem[G][kDecodeWarps];
  __shared__ float acc_smem[G][kDecodeWarps][HD];
  DecodeBlock b;
  if (!start_decode_block<HD, G>(p, split_len_arg, max_splits, q_smem, b)) return;
  const int kv_len = b.kv_len, split_len = b.split_len, splits = b.splits, kvh = b.kvh;
  const int32_t* table = b.table;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t head_row = (size_t)b.row * p.heads + b.h0;  // (row, first head of the group)
  float* out = p.out + head_row * HD;
  int mine = 0;
  for (int split = blockIdx.z; split < splits; split += gridDim.z, ++mine) {
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    SoftmaxState<HD> st[G];
    for (int key0 = start + warp * 32; key0 < end; key0 += kDecodeWarps * 32)
      fold_key_chunk_group<HD, G>(st, q_smem, table, p.block_size, p.kv_heads, kvh, p.k_cache,
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
    if (store_piece<HD, G>(m_smem, l_smem, acc_smem, split, splits, max_splits, head_row, out,
                           part_ml, part_acc))
      return;  // one piece is the whole row
    __syncthreads();  // m_smem / acc_smem are reused by the next piece
  }
  merge_pieces<HD, G>(mine, splits, max_splits, head_row, out, part_ml, part_acc, counters);
}

// ---- the staged kernel ----
// The same pieces, chunk states and arithmetic as decode_attention_kernel (key_dot, fold_scores,
// store_piece, merge_pieces), with each chunk's K and V rows copied into shared memory first.
// kWarps physical warps fold the kDecodeWarps chunk states in turn (state v = warp, warp + kWarps,
// ...): the grouped heads' 4 warps take 89 KB at head size 128, so two blocks share a Hopper SM
// and one fits Ada's 99 KB.
template <int HD>
struct StagedChunk {
  static constexpr int kKRow = HD * 2 + 16;  // bytes; the pad puts 8 lanes' 16-byte reads of 8 rows in
                                             // distinct banks (HD * 2 / 16 + 1 is odd)
  static constexpr int kVRow = HD * 2;
  static constexpr int kBytes = 32 * kKRow + 32 * kVRow + 32 * 4 * 4;  // K, V, p of up to 4 heads
};

template <int HD, int G>
constexpr size_t staged_smem_bytes(int warps) {
  return (size_t)warps * StagedChunk<HD>::kBytes + sizeof(float) * G * kDecodeWarps * HD;
}

// One warp's chunk of up to 32 keys from shared memory: lane j scores key j (the same key_dot and
// fold_scores as fold_key_chunk_group), then every lane sums its dims lane * R .. lane * R + R - 1
// (R = HD / 32) over the chunk's values, in key order.
template <int HD, int G>
__device__ __forceinline__ void fold_staged_chunk(SoftmaxState<HD> (&st)[G], const float* q_smem,
                                                  unsigned char* stage, const int32_t* table,
                                                  int block_size, int kv_heads, int kvh,
                                                  const bf16* __restrict__ k_cache,
                                                  const bf16* __restrict__ v_cache, int key0,
                                                  int n_valid, float scale) {
  using C = StagedChunk<HD>;
  constexpr int R = HD / 32, kRowPieces = HD / 8;  // 16-byte pieces a row
  const int lane = threadIdx.x & 31;
  const bool valid = lane < n_valid;
  unsigned char* ks = stage;
  unsigned char* vs = stage + 32 * C::kKRow;
  float* ps = reinterpret_cast<float*>(vs + 32 * C::kVRow);
  const size_t slot = cache_slot(table, block_size, key0 + (valid ? lane : 0));
#pragma unroll
  for (int i = lane; i < 32 * kRowPieces; i += 32) {
    const int r = i / kRowPieces, c = i % kRowPieces;
    const size_t sr = __shfl_sync(0xffffffffu, slot, r);
    if (r < n_valid) {
      const size_t off = (sr * kv_heads + kvh) * HD + c * 8;
      cp_async_16(ks + r * C::kKRow + c * 16, k_cache + off, 16);
      cp_async_16(vs + r * C::kVRow + c * 16, v_cache + off, 16);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  float s[G], p[G];
  if (valid) {
    uint4 k_raw[HD / 8];
    const uint4* k = reinterpret_cast<const uint4*>(ks + lane * C::kKRow);
#pragma unroll
    for (int c = 0; c < HD / 8; ++c) k_raw[c] = k[c];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = key_dot<HD>(k_raw, q_smem + g * HD) * scale;
  } else {
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = -INFINITY;
  }
  fold_scores<HD, G>(st, s, valid, p);
#pragma unroll
  for (int g = 0; g < G; ++g) ps[lane * 4 + g] = p[g];
  __syncwarp();
  for (int j = 0; j < n_valid; ++j) {
    const float4 pj4 = *reinterpret_cast<const float4*>(ps + j * 4);
    const float pj[4] = {pj4.x, pj4.y, pj4.z, pj4.w};
    const bf16* v = reinterpret_cast<const bf16*>(vs + j * C::kVRow) + lane * R;
    float vr[R];
    if constexpr (R == 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(v);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      vr[0] = a.x, vr[1] = a.y, vr[2] = b.x, vr[3] = b.y;
    } else if constexpr (R == 2) {
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v));
      vr[0] = a.x, vr[1] = a.y;
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) vr[r] = __bfloat162float(v[r]);
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int r = 0; r < R; ++r) st[g].acc[r] += pj[g] * vr[r];
  }
  __syncwarp();  // the next chunk's copies overwrite this one
}

template <int HD, int G, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, kWarps == kGroupedWarps ? 2 : 1)
decode_attention_staged_kernel(PagedAttention p, int split_len_arg, int max_splits,
                               float* __restrict__ part_ml, float* __restrict__ part_acc,
                               int* __restrict__ counters) {
  static_assert(kDecodeWarps % kWarps == 0 && G <= 4 && HD <= 128, "staged decode attention shape");
  __shared__ float q_smem[G * HD];
  __shared__ float m_smem[G][kDecodeWarps], l_smem[G][kDecodeWarps];
  DecodeBlock b;
  if (!start_decode_block<HD, G>(p, split_len_arg, max_splits, q_smem, b)) return;
  const int kv_len = b.kv_len, split_len = b.split_len, splits = b.splits, kvh = b.kvh;
  const int32_t* table = b.table;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  extern __shared__ __align__(16) unsigned char staged_smem[];
  auto acc_smem = reinterpret_cast<float (*)[kDecodeWarps][HD]>(staged_smem);
  unsigned char* stage = staged_smem + sizeof(float) * G * kDecodeWarps * HD +
                         (size_t)warp * StagedChunk<HD>::kBytes;
  const size_t head_row = (size_t)b.row * p.heads + b.h0;  // (row, first head of the group)
  float* out = p.out + head_row * HD;
  constexpr int R = HD / 32;
  int mine = 0;
  for (int split = blockIdx.z; split < splits; split += gridDim.z, ++mine) {
    const int start = split * split_len;
    const int end = min(kv_len, start + split_len);
    for (int v = warp; v < kDecodeWarps; v += kWarps) {
      SoftmaxState<HD> st[G];
      for (int key0 = start + v * 32; key0 < end; key0 += kDecodeWarps * 32)
        fold_staged_chunk<HD, G>(st, q_smem, stage, table, p.block_size, p.kv_heads, kvh, p.k_cache,
                                 p.v_cache, key0, min(32, end - key0), p.scale);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (lane == 0) {
          m_smem[g][v] = st[g].m;
          l_smem[g][v] = st[g].l;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc_smem[g][v][lane * R + r] = st[g].acc[r];
      }
    }
    __syncthreads();
    if (store_piece<HD, G>(m_smem, l_smem, acc_smem, split, splits, max_splits, head_row, out,
                           part_ml, part_acc))
      return;
    __syncthreads();
  }
  merge_pieces<HD, G>(mine, splits, max_splits, head_row, out, part_ml, part_acc, counters);
}

// The staged kernel for G heads: blocks an SM at its shared memory, found once (0 where the
// staging does not fit this GPU's blocks), and its launch.
template <int HD, int G>
struct Staged {
  static constexpr int kWarps = G == 1 ? kOneHeadWarps : kGroupedWarps;
  static constexpr auto kernel = decode_attention_staged_kernel<HD, G, kWarps>;
  static int blocks_per_sm() {
    static const int blocks = [] {
      const int smem = (int)staged_smem_bytes<HD, G>(kWarps);
      int n = 0;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * 32, smem) != cudaSuccess) {
        (void)cudaGetLastError();  // more than the GPU's blocks may opt into: not an error, a fallback
        return 0;
      }
      return n;
    }();
    return blocks;
  }
  static void launch(dim3 grid, cudaStream_t stream, const PagedAttention& p, int split_len, int max_splits,
                     float* partial_ml, float* partial_acc, int* counters) {
    launch_pdl(kernel, grid, kWarps * 32, staged_smem_bytes<HD, G>(kWarps), stream, p, split_len, max_splits,
               partial_ml, partial_acc, counters);
  }
};

// Blocks an SM of the staged kernel for `group` heads (0: the register kernel runs, one head).
template <int HD>
int staged_blocks_per_sm(int group) {
  if constexpr (HD <= 128) {
    switch (group) {
      case 1: return Staged<HD, 1>::blocks_per_sm();
      case 2: return Staged<HD, 2>::blocks_per_sm();
      case 3: return Staged<HD, 3>::blocks_per_sm();
      case 4: return Staged<HD, 4>::blocks_per_sm();
      default: break;
    }
  }
  return 0;
}

static int staged_blocks_per_sm(int group, int head_dim) {
  int blocks = 0;
  HEARTH_DISPATCH_HEAD_DIM(head_dim, blocks = staged_blocks_per_sm<HD>(group));
  return blocks;
}

template <int HD>
void launch_decode_attention_heads(int group, bool staged, dim3 grid, cudaStream_t stream,
                                   const PagedAttention& p, int split_len, int max_splits,
                                   float* partial_ml, float* partial_acc, int* counters) {
  if constexpr (HD <= 128) {
    if (staged) {
      switch (group) {
        case 1: return Staged<HD, 1>::launch(grid, stream, p, split_len, max_splits, partial_ml, partial_acc, counters);
        case 2: return Staged<HD, 2>::launch(grid, stream, p, split_len, max_splits, partial_ml, partial_acc, counters);
        case 3: return Staged<HD, 3>::launch(grid, stream, p, split_len, max_splits, partial_ml, partial_acc, counters);
        case 4: return Staged<HD, 4>::launch(grid, stream, p, split_len, max_splits, partial_ml, partial_acc, counters);
        default: break;
      }
    }
  }
  HEARTH_REQUIRE(group == 1, "decode_attention: unsupported head group");
  launch_pdl(decode_attention_kernel<HD>, grid, kDecodeWarps * 32, 0, stream, p, split_len, max_splits, partial_ml,
             partial_acc, counters);
}

int decode_attention_group(int rows, int heads, int kv_heads, int head_dim) {
  const int sms = sm_count();
  if (head_dim > 128 || (long long)rows * heads < 2LL * sms) return 1;
  // The most heads (<= kMaxGroup) that evenly divide those sharing a KV head: Qwen3-30B-A3B's 8 go
  // in groups of 4, so each K and V row is read twice instead of eight times. Only on the staged
  // kernel, so only where its shared memory fits.
  const int sharing = heads / kv_heads;
  for (int g = std::min(sharing, kMaxGroup); g > 1; --g)
    if (sharing % g == 0) return staged_blocks_per_sm(g, head_dim) > 0 ? g : 1;
  return 1;
}

int decode_attention_grid_splits(int rows, int blocks_x, int blocks_per_sm, int max_splits) {
  // As many blocks per (row, head group) as one wave holds beside the others, at least 1; more
  // pieces than blocks are walked by each block in turn. The rule before (about four blocks an SM,
  // rounded up to a power of two) launched 1,024 blocks at batch 1, nearly all empty at short
  // contexts, and at 4,096 keys queued its 512 working blocks in four rounds: one wave took 8B
  // batch 1 at 4,096 keys from 40.3 to 33.9 us, the same at 256 keys (8.2 / 8.3) and at 64 rows x
  // 144 keys (46.8; H100, test_decode_attention_latency; docs/BENCHMARKS.md).
  const long long z = (long long)blocks_per_sm * sm_count() / ((long long)rows * blocks_x);
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
  const int staged = staged_blocks_per_sm(group, p.head_dim);  // 0: the register kernel
  dim3 grid(blocks_x, p.rows, decode_attention_grid_splits(p.rows, blocks_x, staged > 0 ? staged : 1, max_splits));
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    launch_decode_attention_heads<HD>(group, staged > 0, grid, stream, p, split_len, max_splits, partial_ml,
                                      partial_acc, counters);
    HEARTH_CHECK_LAUNCH("decode_attention_kernel");
  });
}

}  // namespace hearth
