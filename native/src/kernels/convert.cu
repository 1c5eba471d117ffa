// Conversions: fp16 or fp32 checkpoint tensors become bf16 at load (then, for the fast precision,
// scaled fp16 in place, after their largest magnitude is known); fp32 activations become two bf16
// operands (hi + lo) for the exact product, or one scaled fp16 operand for the fast one.
#include <cuda_fp16.h>

#include <cmath>

#include "../common.cuh"
#include "kernels.h"

namespace hearth {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }

template <typename T>
__global__ void convert_kernel(const T* __restrict__ src, bf16* __restrict__ dst, int64_t count) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16(to_float(src[i]));
}

__global__ void split_kernel(const float* __restrict__ x, bf16* __restrict__ hi,
                             bf16* __restrict__ lo, int64_t count) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    const bf16 h = __float2bfloat16(x[i]);
    hi[i] = h;
    lo[i] = __float2bfloat16(x[i] - __bfloat162float(h));
  }
}

void launch_split_bf16(const float* x, bf16* hi, bf16* lo, int64_t count, cudaStream_t stream) {
  HEARTH_REQUIRE(count >= 0, "split: bad count");
  if (count == 0) return;
  const int64_t want = (count + 255) / 256;
  split_kernel<<<(int)(want < 4096 ? want : 4096), 256, 0, stream>>>(x, hi, lo, count);
  HEARTH_CHECK_LAUNCH("split_kernel");
}

void launch_convert_to_bf16(const void* src, int src_dtype, bf16* dst, int64_t count,
                            cudaStream_t stream) {
  HEARTH_REQUIRE(count >= 0, "convert: bad count");
  if (count == 0) return;
  const int64_t want = (count + 255) / 256;
  const int blocks = (int)(want < 4096 ? want : 4096);
  if (src_dtype == 1) {
    convert_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<const __half*>(src), dst, count);
  } else if (src_dtype == 2) {
    convert_kernel<float><<<blocks, 256, 0, stream>>>(static_cast<const float*>(src), dst, count);
  } else {
    throw std::invalid_argument("convert: source dtype must be fp16 (1) or fp32 (2)");
  }
  HEARTH_CHECK_LAUNCH("convert_kernel");
}

float fp16_operand_scale(float amax) {
  if (!(amax > 0.f) || !std::isfinite(amax)) return 1.f;
  int e = 0;
  std::frexp(amax, &e);  // amax in [2^(e-1), 2^e)
  return std::ldexp(1.f, e - 15);
}

__global__ void to_f16_kernel(const float* __restrict__ src, f16* __restrict__ dst, int64_t count,
                              float inv_scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __float2half_rn(src[i] * inv_scale);
}

void launch_convert_to_f16(const float* src, f16* dst, int64_t count, float scale,
                           cudaStream_t stream) {
  HEARTH_REQUIRE(count >= 0 && scale > 0.f, "convert_to_f16: bad arguments");
  if (count == 0) return;
  const int64_t want = (count + 255) / 256;
  to_f16_kernel<<<(int)(want < 4096 ? want : 4096), 256, 0, stream>>>(src, dst, count, 1.f / scale);
  HEARTH_CHECK_LAUNCH("to_f16_kernel");
}

// Magnitudes are non-negative floats, whose bit patterns order as the values do: an integer
// atomicMax on the bits is a float max.
__global__ void amax_bf16_kernel(const bf16* __restrict__ x, int64_t count, float* amax) {
  __shared__ float scratch[32];
  float m = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

void launch_amax_bf16(const bf16* x, int64_t count, float* amax, cudaStream_t stream) {
  HEARTH_REQUIRE(count >= 0, "amax: bad count");
  if (count == 0) return;
  const int64_t want = (count + 255) / 256;
  amax_bf16_kernel<<<(int)(want < 2048 ? want : 2048), 256, 0, stream>>>(x, count, amax);
  HEARTH_CHECK_LAUNCH("amax_bf16_kernel");
}

// Each element is read and rewritten by the same thread: in place is safe.
__global__ void bf16_to_f16_kernel(uint16_t* data, int64_t count, float inv_scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float v = __bfloat162float(__ushort_as_bfloat16(data[i]));
    data[i] = __half_as_ushort(__float2half_rn(v * inv_scale));
  }
}

void launch_bf16_to_f16_inplace(void* data, int64_t count, float scale, cudaStream_t stream) {
  HEARTH_REQUIRE(count >= 0 && scale > 0.f, "bf16_to_f16: bad arguments");
  if (count == 0) return;
  const int64_t want = (count + 255) / 256;
  bf16_to_f16_kernel<<<(int)(want < 8192 ? want : 8192), 256, 0, stream>>>(
      static_cast<uint16_t*>(data), count, 1.f / scale);
  HEARTH_CHECK_LAUNCH("bf16_to_f16_kernel");
}

}  // namespace hearth
