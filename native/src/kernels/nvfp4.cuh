// NVFP4 decoding shared by the GEMV (gemv.cu) and the expansion for tensor-core products
// (nvfp4.cu). docs/NVFP4.md has the format.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace hearth {

// Two e2m1 codes (one byte, the even input in the low nibble) as fp32 values times 2^-14: the sign
// goes to fp16 bit 15 and the three magnitude bits to bits 9-11, which makes the code's fp16 value
// exactly 2^-14 times its e2m1 value (0.5 lands on the fp16 subnormal 2^-15).
__device__ __forceinline__ float2 e2m1_pair_scaled(uint32_t b) {
  const uint32_t bits = ((b & 0x08u) << 12) | ((b & 0x07u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

// An e4m3fn block scale in fp32 (finite: 0x7f / 0xff, NaN, never occurs in a checked checkpoint).
__device__ __forceinline__ float e4m3_value(uint32_t v) {
  const uint32_t e = (v >> 3) & 0xFu, m = v & 7u;
  const float mag = e ? __int_as_float((int)(((e + 120u) << 23) | (m << 20))) : (float)m * 0.001953125f;
  return (v & 0x80u) ? -mag : mag;
}

// e2m1_pair_scaled's 2^-14 undone, folded into the block scale.
constexpr float kE2m1Unscale = 16384.f;

}  // namespace hearth
