// Conversions: fp16 or fp32 checkpoint tensors become bf16 at load; fp32 activations become two
// bf16 operands (hi + lo) for the tensor-core matrix product.
#include <cuda_fp16.h>

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
    store_operand(nullptr, hi, lo, i, x[i]);
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

}  // namespace hearth
