// Causal prefill attention over the paged cache: a chunk of prompt tokens (already written to the
// cache by rope_kv) each attends to the kv_lens[row] = position + 1 keys before and including it.
// out = softmax(q k^T * scale) v, fp32 out. The kernel is chosen by head size:
//  - up to 128: flash-attention-2 on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate).
//    One block per (head, 64 query rows), 4 warps of 16 rows; 64-key tiles of K and V gathered
//    from the paged cache into shared memory with cp.async (two stages); online softmax in fp32
//    registers; P goes to the second product straight from the score registers. q and P are split
//    into bf16 hi + lo (two products each), so they keep ~16 bits of mantissa: the result is as
//    close to fp32 as the scalar kernel (K and V are bf16 in the cache, exact in both): the exact
//    precision's. The fast precision's skips the lo halves (SPLIT = false: one product each,
//    ~3e-3 relative, the rounding transformers' bf16 attention makes and more).
//    All rows of one call must use one block table (a prompt chunk does).
//  - 256: the scalar kernel, one warp per (query row, head), eight rows per block, all fp32.
#include <algorithm>

#include "attention_common.cuh"
#include "cp_async.cuh"

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

// ---- tensor-core variant ----------------------------------------------------------------------

constexpr int kTcQueryTile = 64;  // query rows per block (4 warps x 16)
constexpr int kTcKeyTile = 64;    // keys per shared-memory tile
constexpr int kTcThreads = 128;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

// (a, b) -> bf16x2 hi = round(a, b) and, with SPLIT, lo = round((a, b) - hi).
template <bool SPLIT>
__device__ __forceinline__ void split_bf16(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  memcpy(&hi, &h, 4);
  if constexpr (SPLIT) {
    const float2 hf = __bfloat1622float2(h);
    lo = pack_bf16(a - hf.x, b - hf.y);
  }
}

// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

template <int HD>
constexpr size_t tc_smem_bytes() {
  return (size_t)2 /*stages*/ * 2 /*K,V*/ * kTcKeyTile * (HD + 8) * sizeof(bf16);
}

// Fragment names follow the PTX m16n8k16 layout: lane = 4 g + t; a thread holds rows g and g + 8
// of its warp's 16 query rows and, in a score tile, the key columns 2t and 2t + 1 of each 8.
// Key split (gridDim.z > 1, flash-decoding style): block z walks only its share of the key tiles
// and writes unnormalized partials (o, and m in log2 units + l per row and head) at
// [(z * rows + row) * heads + head]; prefill_attention_merge_kernel combines them.
template <int HD, bool SPLIT>
__global__ void __launch_bounds__(kTcThreads)
prefill_attention_tc_kernel(PagedAttention p, float* __restrict__ part_ml,
                            float* __restrict__ part_acc) {
  constexpr int KT = kTcKeyTile, LD = HD + 8;  // LD: padded smem row (bf16), conflict-free
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);  // [2][KT][LD]
  bf16* vs = ks + 2 * KT * LD;                    // [2][KT][LD]
  __shared__ int s_kv_max;

  const int h = blockIdx.x, q0 = blockIdx.y * kTcQueryTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kvh = h / (p.heads / p.kv_heads);
  const int r_lo = q0 + warp * 16 + g, r_hi = r_lo + 8;
  const int len_lo = r_lo < p.rows ? p.kv_lens[r_lo] : 0;  // rows past the chunk see no keys
  const int len_hi = r_hi < p.rows ? p.kv_lens[r_hi] : 0;
  const int warp_kv = (int)__reduce_max_sync(0xffffffffu, (unsigned)max(len_lo, len_hi));
  if (threadIdx.x == 0) s_kv_max = 0;
  __syncthreads();
  if (lane == 0) atomicMax(&s_kv_max, warp_kv);
  __syncthreads();
  const int kv_max = s_kv_max;
  const int32_t* table = p.block_tables + (size_t)p.row_table[q0] * p.max_blocks;

  // q fragments (bf16 hi, lo) for the warp's 16 rows; rows past the chunk read the last row (masked).
  uint32_t qf[HD / 16][4];
  uint32_t ql[SPLIT ? HD / 16 : 1][4];
  {
    const float* qlo = p.q + ((size_t)min(r_lo, p.rows - 1) * p.heads + h) * HD + 2 * t;
    const float* qhi = p.q + ((size_t)min(r_hi, p.rows - 1) * p.heads + h) * HD + 2 * t;
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
      const float2 a0 = *reinterpret_cast<const float2*>(qlo + kc * 16);
      const float2 a1 = *reinterpret_cast<const float2*>(qhi + kc * 16);
      const float2 a2 = *reinterpret_cast<const float2*>(qlo + kc * 16 + 8);
      const float2 a3 = *reinterpret_cast<const float2*>(qhi + kc * 16 + 8);
      uint32_t* lo = ql[SPLIT ? kc : 0];
      split_bf16<SPLIT>(a0.x, a0.y, qf[kc][0], lo[0]);
      split_bf16<SPLIT>(a1.x, a1.y, qf[kc][1], lo[1]);
      split_bf16<SPLIT>(a2.x, a2.y, qf[kc][2], lo[2]);
      split_bf16<SPLIT>(a3.x, a3.y, qf[kc][3], lo[3]);
    }
  }

  auto load_tile = [&](int tile, int buf) {
    constexpr int CH = HD / 8;  // 16-byte chunks per key row
    const int key0 = tile * KT;
    bf16* kd = ks + buf * KT * LD;
    bf16* vd = vs + buf * KT * LD;
    for (int i = threadIdx.x; i < KT * CH; i += kTcThreads) {
      const int kr = i / CH, c = i - kr * CH;
      const int key = key0 + kr;
      const bool ok = key < kv_max;  // keys past the block's last row: zeros (never NaN)
      size_t off = 0;
      if (ok) off = (cache_slot(table, p.block_size, key) * p.kv_heads + kvh) * HD + c * 8;
      cp_async_16(kd + kr * LD + c * 8, p.k_cache + off, ok ? 16 : 0);  // 0: zero-filled
      cp_async_16(vd + kr * LD + c * 8, p.v_cache + off, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float o[HD / 8][4];
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  const float scale_log2 = p.scale * 1.4426950408889634f;
  const int all_tiles = (kv_max + KT - 1) / KT;
  const int per_split = (all_tiles + (int)gridDim.z - 1) / (int)gridDim.z;
  const int first_tile = min(all_tiles, (int)blockIdx.z * per_split);
  const int n_tiles = min(all_tiles, first_tile + per_split);  // one past this block's last tile

  if (first_tile < n_tiles) load_tile(first_tile, first_tile & 1);
  for (int it = first_tile; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) {
      load_tile(it + 1, (it + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int key0 = it * KT;
    if (key0 < warp_kv) {  // warp-uniform: a warp whose rows see none of this tile skips it
      const bf16* kb = ks + (it & 1) * KT * LD;
      const bf16* vb = vs + (it & 1) * KT * LD;
      float s[KT / 8][4];
#pragma unroll
      for (int nb = 0; nb < KT / 8; ++nb) {
        s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
        const bf16* krow = kb + (nb * 8 + g) * LD + 2 * t;
#pragma unroll
        for (int kc = 0; kc < HD / 16; ++kc) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + kc * 16);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + kc * 16 + 8);
          mma_bf16(s[nb], qf[kc], b0, b1);
          if constexpr (SPLIT) mma_bf16(s[nb], ql[kc], b0, b1);
        }
      }
      // mask (causal / chunk end), scale to log2 units, row max over the quad
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < KT / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + nb * 8 + 2 * t + e;
          s[nb][e] = key < len_lo ? s[nb][e] * scale_log2 : -INFINITY;
          s[nb][2 + e] = key < len_hi ? s[nb][2 + e] * scale_log2 : -INFINITY;
          mx_lo = fmaxf(mx_lo, s[nb][e]);
          mx_hi = fmaxf(mx_hi, s[nb][2 + e]);
        }
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
      }
      const float new_lo = fmaxf(m_lo, mx_lo), new_hi = fmaxf(m_hi, mx_hi);
      const float base_lo = new_lo == -INFINITY ? 0.f : new_lo;  // no (-inf) - (-inf)
      const float base_hi = new_hi == -INFINITY ? 0.f : new_hi;
      const float corr_lo = exp2f(m_lo - base_lo), corr_hi = exp2f(m_hi - base_hi);
      m_lo = new_lo;
      m_hi = new_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int nb = 0; nb < KT / 8; ++nb) {
        s[nb][0] = exp2f(s[nb][0] - base_lo);
        s[nb][1] = exp2f(s[nb][1] - base_lo);
        s[nb][2] = exp2f(s[nb][2] - base_hi);
        s[nb][3] = exp2f(s[nb][3] - base_hi);
        sum_lo += s[nb][0] + s[nb][1];
        sum_hi += s[nb][2] + s[nb][3];
      }
      l_lo = l_lo * corr_lo + sum_lo;  // this thread's columns; the quad is summed at the end
      l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
      for (int nd = 0; nd < HD / 8; ++nd) {
        o[nd][0] *= corr_lo;
        o[nd][1] *= corr_lo;
        o[nd][2] *= corr_hi;
        o[nd][3] *= corr_hi;
      }
      // o += P V: the score registers of two 8-key blocks are one 16x16 A fragment.
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
        uint32_t a[4], al[4];
        split_bf16<SPLIT>(s[2 * kk][0], s[2 * kk][1], a[0], al[0]);
        split_bf16<SPLIT>(s[2 * kk][2], s[2 * kk][3], a[1], al[1]);
        split_bf16<SPLIT>(s[2 * kk + 1][0], s[2 * kk + 1][1], a[2], al[2]);
        split_bf16<SPLIT>(s[2 * kk + 1][2], s[2 * kk + 1][3], a[3], al[3]);
        // ldmatrix.x4.trans: lanes 0-15 address key rows kk*16 + 0..15 at dims nd*8, lanes 16-31
        // the same rows at dims nd*8 + 8: r[0..1] = B of dims block nd, r[2..3] of block nd + 1.
        const bf16* vrow = vb + (kk * 16 + (lane & 15)) * LD + (lane >> 4) * 8;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd += 2) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, vrow + nd * 8);
          mma_bf16(o[nd], a, r[0], r[1]);
          mma_bf16(o[nd + 1], a, r[2], r[3]);
          if constexpr (SPLIT) {
            mma_bf16(o[nd], al, r[0], r[1]);
            mma_bf16(o[nd + 1], al, r[2], r[3]);
          }
        }
      }
    }
    __syncthreads();  // the buffer just read is the next load's target
  }

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (gridDim.z > 1) {  // partials: unnormalized o, (m, l); rows that saw no key keep m = -inf, l = 0
    const size_t base = (size_t)blockIdx.z * p.rows;
    if (r_lo < p.rows) {
      const size_t pr = (base + r_lo) * p.heads + h;
      float* out = part_acc + pr * HD + 2 * t;
#pragma unroll
      for (int nd = 0; nd < HD / 8; ++nd)
        *reinterpret_cast<float2*>(out + nd * 8) = make_float2(o[nd][0], o[nd][1]);
      if (t == 0) *reinterpret_cast<float2*>(part_ml + pr * 2) = make_float2(m_lo, l_lo);
    }
    if (r_hi < p.rows) {
      const size_t pr = (base + r_hi) * p.heads + h;
      float* out = part_acc + pr * HD + 2 * t;
#pragma unroll
      for (int nd = 0; nd < HD / 8; ++nd)
        *reinterpret_cast<float2*>(out + nd * 8) = make_float2(o[nd][2], o[nd][3]);
      if (t == 0) *reinterpret_cast<float2*>(part_ml + pr * 2) = make_float2(m_hi, l_hi);
    }
    return;
  }
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f;
  const float inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
  if (r_lo < p.rows) {
    float* out = p.out + ((size_t)r_lo * p.heads + h) * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd)
      *reinterpret_cast<float2*>(out + nd * 8) = make_float2(o[nd][0] * inv_lo, o[nd][1] * inv_lo);
  }
  if (r_hi < p.rows) {
    float* out = p.out + ((size_t)r_hi * p.heads + h) * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; ++nd)
      *reinterpret_cast<float2*>(out + nd * 8) = make_float2(o[nd][2] * inv_hi, o[nd][3] * inv_hi);
  }
}

// out[row, head] = sum_z 2^(m_z - M) o_z / sum_z 2^(m_z - M) l_z, M = max_z m_z (log2 units).
template <int HD>
__global__ void prefill_attention_merge_kernel(PagedAttention p, int splits,
                                               const float* __restrict__ part_ml,
                                               const float* __restrict__ part_acc) {
  const int h = blockIdx.x, row = blockIdx.y;
  const size_t stride = (size_t)p.rows * p.heads;
  const size_t pr = (size_t)row * p.heads + h;
  float m = -INFINITY;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, part_ml[(z * stride + pr) * 2]);
  const float base = m == -INFINITY ? 0.f : m;
  float l = 0.f;
  for (int z = 0; z < splits; ++z) {
    const float mz = part_ml[(z * stride + pr) * 2];
    if (mz != -INFINITY) l += part_ml[(z * stride + pr) * 2 + 1] * exp2f(mz - base);
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* out = p.out + pr * HD;
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float a = 0.f;
    for (int z = 0; z < splits; ++z) {
      const float mz = part_ml[(z * stride + pr) * 2];
      if (mz != -INFINITY) a += part_acc[(z * stride + pr) * HD + d] * exp2f(mz - base);
    }
    out[d] = a * inv;
  }
}

int prefill_key_splits(int rows, int heads, int head_dim, int max_kv_len, int part_rows) {
  if (rows <= 0 || head_dim > 128 || max_kv_len <= 0) return 1;
  const int blocks = heads * ((rows + kTcQueryTile - 1) / kTcQueryTile);
  if (blocks >= 132) return 1;  // a full wave of (head, query tile) blocks already
  const int tiles = (max_kv_len + kTcKeyTile - 1) / kTcKeyTile;
  int splits = (2 * 132 + blocks - 1) / blocks;  // ~two blocks per SM
  splits = std::min(splits, tiles / 4);           // each split walks >= 4 key tiles
  splits = std::min(splits, part_rows / rows);
  splits = std::min(splits, 32);
  return splits >= 2 ? splits : 1;
}

static void check_prefill_args(const PagedAttention& p) {
  HEARTH_REQUIRE(p.rows >= 0 && p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0,
                 "prefill_attention: heads must be a multiple of kv_heads");
}

void launch_prefill_attention_scalar(const PagedAttention& p, cudaStream_t stream) {
  check_prefill_args(p);
  if (p.rows == 0) return;
  dim3 grid(p.heads, (p.rows + kPrefillRowsPerBlock - 1) / kPrefillRowsPerBlock);
  HEARTH_DISPATCH_HEAD_DIM(p.head_dim, {
    prefill_attention_kernel<HD><<<grid, kPrefillRowsPerBlock * 32, 0, stream>>>(p);
    HEARTH_CHECK_LAUNCH("prefill_attention_kernel");
  });
}

template <int HD, bool SPLIT>
static void launch_tc(const PagedAttention& p, int key_splits, float* part_ml, float* part_acc,
                      cudaStream_t stream) {
  if constexpr (HD > 128) {
    launch_prefill_attention_scalar(p, stream);
  } else {
    constexpr size_t smem = tc_smem_bytes<HD>();
    static const cudaError_t attr =
        cudaFuncSetAttribute(prefill_attention_tc_kernel<HD, SPLIT>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    HEARTH_CUDA(attr);
    if (key_splits < 2 || !part_ml || !part_acc) key_splits = 1;
    dim3 grid(p.heads, (p.rows + kTcQueryTile - 1) / kTcQueryTile, key_splits);
    prefill_attention_tc_kernel<HD, SPLIT><<<grid, kTcThreads, smem, stream>>>(p, part_ml, part_acc);
    HEARTH_CHECK_LAUNCH("prefill_attention_tc_kernel");
    if (key_splits > 1) {
      prefill_attention_merge_kernel<HD><<<dim3(p.heads, p.rows), HD, 0, stream>>>(
          p, key_splits, part_ml, part_acc);
      HEARTH_CHECK_LAUNCH("prefill_attention_merge_kernel");
    }
  }
}

void launch_prefill_attention_tc(const PagedAttention& p, cudaStream_t stream, int key_splits,
                                 float* part_ml, float* part_acc, bool split_products) {
  check_prefill_args(p);
  if (p.rows == 0) return;
  HEARTH_REQUIRE(key_splits >= 1 && key_splits <= 64, "prefill_attention: key_splits 1..64");
  if (split_products) {
    HEARTH_DISPATCH_HEAD_DIM(p.head_dim, { launch_tc<HD, true>(p, key_splits, part_ml, part_acc, stream); });
  } else {
    HEARTH_DISPATCH_HEAD_DIM(p.head_dim, { launch_tc<HD, false>(p, key_splits, part_ml, part_acc, stream); });
  }
}

void launch_prefill_attention(const PagedAttention& p, cudaStream_t stream,
                              const PrefillSplitWork* work, bool split_products) {
  check_prefill_args(p);
  if (p.rows == 0) return;
  int splits = 1;
  if (work) splits = prefill_key_splits(p.rows, p.heads, p.head_dim, work->max_kv_len, work->part_rows);
  float* ml = splits > 1 ? work->part_ml : nullptr;
  float* acc = splits > 1 ? work->part_acc : nullptr;
  launch_prefill_attention_tc(p, stream, splits, ml, acc, split_products);
}

}  // namespace hearth
