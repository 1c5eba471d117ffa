// The rotary embedding of one (token, head, dim pair) and its store, shared by the rope kernel and
// the qkv GEMV's rope epilogue so both write the same bits. Rotate-half convention (Hugging Face
// Llama): for i < hd/2, out[i] = x[i] cos - x[i + hd/2] sin, out[i + hd/2] = x[i + hd/2] cos +
// x[i] sin, angle = float(position) * inv_freq[i] in fp32, inv_freq already carries any Llama-3
// scaling. Query heads go to q_out (fp32), key heads rotated and value heads as they are to the
// paged cache (bf16, layout [slot, kv_heads, hd]) at the token's slot.
#pragma once
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

// h: 0..heads-1 query heads, then kv_heads key heads, then kv_heads value heads.
__device__ __forceinline__ void rope_store(const RopeTarget& t, int token, int h, int i, float x1,
                                           float x2) {
  const int half = t.head_dim >> 1;
  const size_t slot = (size_t)t.slots[token];
  if (h >= t.heads + t.kv_heads) {  // value: copied as is
    bf16* dst = t.v_cache + (slot * t.kv_heads + (h - t.heads - t.kv_heads)) * t.head_dim;
    dst[i] = __float2bfloat16(x1);
    dst[i + half] = __float2bfloat16(x2);
    return;
  }
  const float angle = (float)t.positions[token] * t.inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  const float o1 = x1 * c - x2 * s;
  const float o2 = x2 * c + x1 * s;
  if (h < t.heads) {
    float* dst = t.q_out + ((size_t)token * t.heads + h) * t.head_dim;
    dst[i] = o1;
    dst[i + half] = o2;
  } else {
    bf16* dst = t.k_cache + (slot * t.kv_heads + (h - t.heads)) * t.head_dim;
    dst[i] = __float2bfloat16(o1);
    dst[i + half] = __float2bfloat16(o2);
  }
}

}  // namespace hearth
