// Rotary position embedding fused with the KV-cache write. For each token, each query head is
// rotated into q_out (fp32) and each key head rotated and written, with its value, as bf16 into the
// paged cache at the token's slot. Rotate-half convention (Hugging Face Llama): for i < hd/2,
//   out[i] = x[i] cos - x[i + hd/2] sin,  out[i + hd/2] = x[i + hd/2] cos + x[i] sin,
// angle = float(position) * inv_freq[i] in fp32, inv_freq already carries any Llama-3 scaling.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void rope_kv_write_kernel(const float* __restrict__ qkv, int heads, int kv_heads,
                                     int head_dim, const int32_t* __restrict__ positions,
                                     const int32_t* __restrict__ slots,
                                     const float* __restrict__ inv_freq, float* __restrict__ q_out,
                                     bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                     int early_trigger) {
  // early_trigger (HEARTH_ATTN_PREFETCH=early, the default): the next kernel (decode attention) may launch before
  // this one waits, so its prefetch overlaps the qkv GEMV; it still waits for this kernel's end.
  if (early_trigger) pdl_launch_dependents();
  pdl_wait();
  if (!early_trigger) pdl_launch_dependents();
  const int t = blockIdx.x;
  const int h = blockIdx.y;  // 0..heads-1 query heads, then kv_heads key heads, then kv_heads values
  const int half = head_dim >> 1;
  const int row_width = (heads + 2 * kv_heads) * head_dim;
  const float* src = qkv + (size_t)t * row_width + (size_t)h * head_dim;
  const float pos = (float)positions[t];
  const size_t slot = (size_t)slots[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = src[i], x2 = src[i + half];
    if (h >= heads + kv_heads) {  // value: copied as is
      bf16* dst = v_cache + (slot * kv_heads + (h - heads - kv_heads)) * head_dim;
      dst[i] = __float2bfloat16(x1);
      dst[i + half] = __float2bfloat16(x2);
      continue;
    }
    const float angle = pos * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    const float o1 = x1 * c - x2 * s;
    const float o2 = x2 * c + x1 * s;
    if (h < heads) {
      float* dst = q_out + ((size_t)t * heads + h) * head_dim;
      dst[i] = o1;
      dst[i + half] = o2;
    } else {
      bf16* dst = k_cache + (slot * kv_heads + (h - heads)) * head_dim;
      dst[i] = __float2bfloat16(o1);
      dst[i + half] = __float2bfloat16(o2);
    }
  }
}

void launch_rope_kv_write(const float* qkv, int tokens, int heads, int kv_heads, int head_dim,
                          const int32_t* positions, const int32_t* slots, const float* inv_freq,
                          float* q_out, bf16* k_cache, bf16* v_cache, cudaStream_t stream) {
  HEARTH_REQUIRE(tokens >= 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                 "rope_kv_write: bad shape");
  if (tokens == 0) return;
  dim3 grid(tokens, heads + 2 * kv_heads);
  const int threads = head_dim / 2 < 128 ? ((head_dim / 2 + 31) / 32) * 32 : 128;
  launch_pdl(rope_kv_write_kernel, grid, threads, 0, stream, qkv, heads, kv_heads, head_dim,
             positions, slots, inv_freq, q_out, k_cache, v_cache,
             decode_attention_prefetch() == 2 ? 1 : 0);
  HEARTH_CHECK_LAUNCH("rope_kv_write_kernel");
}

}  // namespace hearth
