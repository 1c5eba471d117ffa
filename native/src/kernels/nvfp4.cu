// NVFP4 weights expanded into 16 bits for the tensor-core product (prefill and batches beyond the
// GEMV's rows): each thread takes one chunk of 32 codes (16 bytes) with its two block scales and
// writes e2m1 * e4m3 for each, exact in fp16 and bf16 (at most 6 significant bits, magnitudes
// 2^-10 .. 2688). The global scale stays out: the product applies it to fp32 sums (gemm.cu's alpha).
#include "nvfp4.cuh"
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

namespace {

template <typename Out>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<f16>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<bf16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <typename Out>
__global__ void nvfp4_expand_kernel(const uint4* __restrict__ codes, const uint16_t* __restrict__ scales,
                                    uint4* __restrict__ out, int64_t chunks) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const uint4 raw = codes[i];
  const uint32_t sc = scales[i];
  const uint32_t* words = reinterpret_cast<const uint32_t*>(&raw);
  uint32_t packed[16];  // 32 outputs, two per word
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float block = e4m3_value((sc >> (8 * h)) & 0xFFu) * kE2m1Unscale;
#pragma unroll
    for (int wd = 0; wd < 2; ++wd)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float2 v = e2m1_pair_scaled((words[2 * h + wd] >> (8 * b)) & 0xFFu);
        packed[8 * h + 4 * wd + b] = pack2<Out>(v.x * block, v.y * block);
      }
  }
  uint4* dst = out + 4 * i;
#pragma unroll
  for (int q = 0; q < 4; ++q)
    dst[q] = make_uint4(packed[4 * q], packed[4 * q + 1], packed[4 * q + 2], packed[4 * q + 3]);
}

}  // namespace

WeightView launch_nvfp4_expand(const WeightView& w, int n, int k, void* out, bool to_fp16,
                               cudaStream_t stream) {
  HEARTH_REQUIRE(w.format == WeightFormat::NvFp4 && w.data && w.block_scales && out,
                 "nvfp4_expand: needs an NVFP4 weight and an output buffer");
  HEARTH_REQUIRE(n > 0 && k > 0 && k % 32 == 0, "nvfp4_expand: k must be a multiple of 32");
  const int64_t chunks = (int64_t)n * (k / 32);
  const int threads = 256;
  const unsigned blocks = (unsigned)((chunks + threads - 1) / threads);
  const uint4* codes = static_cast<const uint4*>(w.data);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(w.block_scales);
  if (to_fp16)
    nvfp4_expand_kernel<f16><<<blocks, threads, 0, stream>>>(codes, scales, static_cast<uint4*>(out), chunks);
  else
    nvfp4_expand_kernel<bf16><<<blocks, threads, 0, stream>>>(codes, scales, static_cast<uint4*>(out), chunks);
  HEARTH_CHECK_LAUNCH("nvfp4_expand_kernel");
  WeightView expanded;
  expanded.data = out;
  expanded.format = to_fp16 ? WeightFormat::Fp16 : WeightFormat::Bf16;
  expanded.scale = w.scale;
  return expanded;
}

}  // namespace hearth
