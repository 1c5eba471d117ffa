// Device helpers shared by the two paged-attention kernels: one warp folds a chunk of up to 32
// keys into an online-softmax state (running max m, running sum l, unnormalized output acc).
// Lane j scores key j; then every lane accumulates dims lane, lane+32, ... over the chunk's values.
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

template <int HD>
__device__ __forceinline__ void fold_key_chunk(SoftmaxState<HD>& st, const float* q_smem,
                                               const int32_t* table, int block_size, int kv_heads,
                                               int kvh, const bf16* __restrict__ k_cache,
                                               const bf16* __restrict__ v_cache, int key0,
                                               int n_valid, float scale) {
  const int lane = threadIdx.x & 31;
  const bool valid = lane < n_valid;
  size_t slot = 0;
  float s = -INFINITY;
  if (valid) {
    slot = cache_slot(table, block_size, key0 + lane);
    const uint4* k = reinterpret_cast<const uint4*>(k_cache + (slot * kv_heads + kvh) * HD);
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < HD / 8; ++c) {
      const uint4 raw = k[c];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(pairs[e]);
        dot += f.x * q_smem[c * 8 + 2 * e] + f.y * q_smem[c * 8 + 2 * e + 1];
      }
    }
    s = dot * scale;
  }
  const float new_m = fmaxf(st.m, warp_max(s));
  const float corr = expf(st.m - new_m);  // 0 when st.m is -inf
  const float p = valid ? expf(s - new_m) : 0.f;
  st.l = st.l * corr + warp_sum(p);
  st.m = new_m;
#pragma unroll
  for (int r = 0; r < HD / 32; ++r) st.acc[r] *= corr;
  // Values in groups of kValueGroup keys (the whole chunk up to head size 64): the group's loads
  // are issued together, then summed in key order (one key at a time they were a chain of
  // dependent global loads). Keys past n_valid in the last group add 0 * (the chunk's first
  // value), so the sum is the same as stopping at n_valid.
  constexpr int kValueGroup = HD <= 64 ? 32 : HD <= 128 ? 16 : 8;
  for (int j0 = 0; j0 < n_valid; j0 += kValueGroup) {
    float pj[kValueGroup], vj[kValueGroup][HD / 32];
#pragma unroll
    for (int u = 0; u < kValueGroup; ++u) {
      const int j = j0 + u < n_valid ? j0 + u : 0;
      pj[u] = j0 + u < n_valid ? __shfl_sync(0xffffffffu, p, j) : 0.f;
      const size_t sj = __shfl_sync(0xffffffffu, slot, j);
      const bf16* v = v_cache + (sj * kv_heads + kvh) * HD;
#pragma unroll
      for (int r = 0; r < HD / 32; ++r) vj[u][r] = __bfloat162float(v[lane + 32 * r]);
    }
#pragma unroll
    for (int u = 0; u < kValueGroup; ++u)
#pragma unroll
      for (int r = 0; r < HD / 32; ++r) st.acc[r] += pj[u] * vj[u][r];
  }
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
