// Device helpers shared by the paged-attention kernels: one warp folds a chunk of up to 32 keys
// into online-softmax states (running max m, running sum l, unnormalized output acc).
#pragma once
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

template <int HD>
struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.f;
  float acc[HD / 32] = {};
};

__device__ __forceinline__ size_t cache_slot(const int32_t* table, int block_size, int key) {
  return (size_t)table[key / block_size] * block_size + key % block_size;
}

// A key's score against one query: the dot product in fp32, in dimension order (q: HD fp32, k_raw:
// the key's HD bf16 values). Every decode kernel scores through this one expression, so a head's
// scores have the same bits in each of them.
template <int HD>
__device__ __forceinline__ float key_dot(const uint4 (&k_raw)[HD / 8], const float* q) {
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < HD / 8; ++c) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&k_raw[c]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(pairs[e]);
      dot += f.x * q[c * 8 + 2 * e] + f.y * q[c * 8 + 2 * e + 1];
    }
  }
  return dot;
}

// Folds a warp's chunk of scores (lane j: key j's score s[g] for each head, -inf past the chunk's
// valid keys) into the running states: new max, the old sums and outputs rescaled, and p[g] =
// exp(s - max) for lane j's key (0 where not valid). The values are added by the caller.
template <int HD, int G>
__device__ __forceinline__ void fold_scores(SoftmaxState<HD> (&st)[G], const float (&s)[G], bool valid,
                                            float (&p)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float new_m = fmaxf(st[g].m, warp_max(s[g]));
    const float corr = expf(st[g].m - new_m);  // 0 when st.m is -inf
    p[g] = valid ? expf(s[g] - new_m) : 0.f;
    st[g].l = st[g].l * corr + warp_sum(p[g]);
    st[g].m = new_m;
#pragma unroll
    for (int r = 0; r < HD / 32; ++r) st[g].acc[r] *= corr;
  }
}

// One warp folds a chunk of up to 32 keys of KV head `kvh` into the states of the G query heads
// that share it (grouped-query attention: each K and V row is read once for all G). q_smem holds
// the G queries, [G][HD] fp32. Lane j scores key j for each head; then every lane accumulates dims
// lane, lane+32, ... over the chunk's values. The first group of value loads is issued with the
// key loads (its addresses need only the slots), so K and V cost one round trip to memory, not
// two. A head's arithmetic is the same expressions in the same order at any G.
template <int HD, int G>
__device__ __forceinline__ void fold_key_chunk_group(SoftmaxState<HD> (&st)[G], const float* q_smem,
                                                     const int32_t* table, int block_size,
                                                     int kv_heads, int kvh,
                                                     const bf16* __restrict__ k_cache,
                                                     const bf16* __restrict__ v_cache, int key0,
                                                     int n_valid, float scale) {
  const int lane = threadIdx.x & 31;
  const bool valid = lane < n_valid;
  // Lanes past n_valid take key0's slot: its loads are valid addresses, their values unused.
  const size_t slot = cache_slot(table, block_size, key0 + (valid ? lane : 0));
  uint4 k_raw[HD / 8];
  {
    const uint4* k = reinterpret_cast<const uint4*>(k_cache + (slot * kv_heads + kvh) * HD);
#pragma unroll
    for (int c = 0; c < HD / 8; ++c) k_raw[c] = k[c];
  }
  // Values in groups of kValueGroup keys: a group's loads are issued together, then summed in key
  // order. Keys past n_valid in the last group add 0 * (the chunk's first value), so the sum is
  // the same as stopping at n_valid.
  constexpr int kValueGroup = HD <= 64 ? 32 : HD <= 128 ? 16 : 8;
  float vj[kValueGroup][HD / 32];
  auto load_values = [&](int j0) {
#pragma unroll
    for (int u = 0; u < kValueGroup; ++u) {
      const int j = j0 + u < n_valid ? j0 + u : 0;
      const size_t sj = __shfl_sync(0xffffffffu, slot, j);
      const bf16* v = v_cache + (sj * kv_heads + kvh) * HD;
#pragma unroll
      for (int r = 0; r < HD / 32; ++r) vj[u][r] = __bfloat162float(v[lane + 32 * r]);
    }
  };
  load_values(0);
  float s[G], p[G];
#pragma unroll
  for (int g = 0; g < G; ++g) s[g] = valid ? key_dot<HD>(k_raw, q_smem + g * HD) * scale : -INFINITY;
  fold_scores<HD, G>(st, s, valid, p);
  for (int j0 = 0; j0 < n_valid; j0 += kValueGroup) {
    if (j0 > 0) load_values(j0);
#pragma unroll
    for (int u = 0; u < kValueGroup; ++u) {
      const int j = j0 + u < n_valid ? j0 + u : 0;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pj = j0 + u < n_valid ? __shfl_sync(0xffffffffu, p[g], j) : 0.f;
#pragma unroll
        for (int r = 0; r < HD / 32; ++r) st[g].acc[r] += pj * vj[u][r];
      }
    }
  }
}

// One query head (the prefill scalar kernel and the per-head decode kernels).
template <int HD>
__device__ __forceinline__ void fold_key_chunk(SoftmaxState<HD>& st, const float* q_smem,
                                               const int32_t* table, int block_size, int kv_heads,
                                               int kvh, const bf16* __restrict__ k_cache,
                                               const bf16* __restrict__ v_cache, int key0,
                                               int n_valid, float scale) {
  SoftmaxState<HD>(&one)[1] = *reinterpret_cast<SoftmaxState<HD>(*)[1]>(&st);
  fold_key_chunk_group<HD, 1>(one, q_smem, table, block_size, kv_heads, kvh, k_cache, v_cache,
                              key0, n_valid, scale);
}

// Calls f.template operator()<HD>() for the supported head sizes.
#define HEARTH_DISPATCH_HEAD_DIM(hd, ...)                                     \
  switch (hd) {                                                               \
    case 32: { constexpr int HD = 32; __VA_ARGS__; break; }                   \
    case 64: { constexpr int HD = 64; __VA_ARGS__; break; }                   \
    case 96: { constexpr int HD = 96; __VA_ARGS__; break; }                   \
    case 128: { constexpr int HD = 128; __VA_ARGS__; break; }                 \
    case 256: { constexpr int HD = 256; __VA_ARGS__; break; }                 \
    default: throw std::invalid_argument("attention: head_dim must be 32, 64, 96, 128 or 256"); \
  }

}  // namespace hearth
