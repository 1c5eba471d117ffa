// RMSNorm fused with the residual add: residual += delta (optional; each delta row times
// delta_row_scale[r] when the product that wrote it ran over a row-scaled operand), then
// y = residual * rsqrt(mean(residual^2) + eps) * weight. One block of 256 threads per row; the
// residual stream is fp32; y goes out as fp32 (the exact product's input, or a GEMV's) or as the
// fast product's fp16 operand y / out16_scale (out16_scale: a static power of two, kernels.h).
// The sum of squares is reduced in a fixed order, whatever the number of rows.
// Rows of a multiple of 4 up to kNormMaxVectors * 4 * 256 values (every model we plan) stay in
// registers as float4s: one read of the residual and the delta, all of a thread's loads in flight
// at once. The scalar loop read the row twice, one value a thread at a time: 13.6 us a call on the
// 8B's 64-row decode step (H100), about its latency, not its 4 MB.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void rmsnorm_residual_kernel(float* __restrict__ residual, const float* __restrict__ delta,
                                        const float* __restrict__ delta_row_scale,
                                        const bf16* __restrict__ weight, float* __restrict__ out,
                                        f16* __restrict__ out16, float out16_inv_scale, int hidden,
                                        float eps) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const size_t base = (size_t)blockIdx.x * hidden;
  float* x = residual + base;
  const float dscale = delta_row_scale ? delta_row_scale[blockIdx.x] : 1.f;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = x[i];
    if (delta) {
      v += delta[base + i] * dscale;
      x[i] = v;
    }
    sq += v * v;
  }
  const float total = block_sum(sq, scratch);
  const float inv = rsqrtf(total / (float)hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float y = x[i] * inv * __bfloat162float(weight[i]);
    if (out16)
      out16[base + i] = __float2half_rn(y * out16_inv_scale);
    else
      out[base + i] = y;
  }
}

constexpr int kNormThreads = 256;
constexpr int kNormMaxVectors = 8;

template <int V>  // float4s a thread
__global__ void __launch_bounds__(kNormThreads) rmsnorm_residual_vec_kernel(
    float* __restrict__ residual, const float* __restrict__ delta, const float* __restrict__ delta_row_scale,
    const bf16* __restrict__ weight, float* __restrict__ out, f16* __restrict__ out16, float out16_inv_scale,
    int hidden, float eps) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const size_t base = (size_t)blockIdx.x * hidden;
  const int n4 = hidden / 4;
  float4* x = reinterpret_cast<float4*>(residual + base);
  const float4* d = delta ? reinterpret_cast<const float4*>(delta + base) : nullptr;
  const float dscale = delta_row_scale ? delta_row_scale[blockIdx.x] : 1.f;
  float4 v[V];
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= n4) break;
    v[j] = x[i];
    if (d) {
      const float4 e = d[i];
      v[j].x += e.x * dscale;
      v[j].y += e.y * dscale;
      v[j].z += e.z * dscale;
      v[j].w += e.w * dscale;
      x[i] = v[j];
    }
    sq += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  const float inv = rsqrtf(block_sum(sq, scratch) / (float)hidden + eps);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= n4) break;
    const uint2 wb = __ldg(reinterpret_cast<const uint2*>(weight) + i);
    const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wb.x));
    const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wb.y));
    const float4 y = make_float4(v[j].x * inv * w01.x, v[j].y * inv * w01.y, v[j].z * inv * w23.x,
                                 v[j].w * inv * w23.y);
    if (out16) {
      const __half2 lo = __floats2half2_rn(y.x * out16_inv_scale, y.y * out16_inv_scale);
      const __half2 hi = __floats2half2_rn(y.z * out16_inv_scale, y.w * out16_inv_scale);
      uint2 h;
      h.x = *reinterpret_cast<const uint32_t*>(&lo);
      h.y = *reinterpret_cast<const uint32_t*>(&hi);
      reinterpret_cast<uint2*>(out16 + base)[i] = h;
    } else {
      reinterpret_cast<float4*>(out + base)[i] = y;
    }
  }
}

void launch_rmsnorm_residual(float* residual, const float* delta, const bf16* weight, float* out,
                             int rows, int hidden, float eps, cudaStream_t stream,
                             const float* delta_row_scale, f16* out16, float out16_scale) {
  HEARTH_REQUIRE(rows >= 0 && hidden > 0, "rmsnorm: bad shape");
  HEARTH_REQUIRE((out != nullptr) != (out16 != nullptr), "rmsnorm: one output, fp32 or fp16");
  HEARTH_REQUIRE(out16_scale > 0.f, "rmsnorm: the fp16 operand's scale must be positive");
  if (rows == 0) return;
  const int vectors = (hidden / 4 + kNormThreads - 1) / kNormThreads;
  if (hidden % 4 == 0 && vectors <= kNormMaxVectors) {
    auto launch = [&](auto kernel) {
      launch_pdl(kernel, rows, kNormThreads, 0, stream, residual, delta, delta_row_scale, weight, out, out16,
                 1.f / out16_scale, hidden, eps);
    };
    if (vectors <= 1) launch(rmsnorm_residual_vec_kernel<1>);
    else if (vectors <= 2) launch(rmsnorm_residual_vec_kernel<2>);
    else if (vectors <= 4) launch(rmsnorm_residual_vec_kernel<4>);
    else launch(rmsnorm_residual_vec_kernel<8>);
  } else {
    launch_pdl(rmsnorm_residual_kernel, rows, kNormThreads, 0, stream, residual, delta, delta_row_scale, weight,
               out, out16, 1.f / out16_scale, hidden, eps);
  }
  HEARTH_CHECK_LAUNCH("rmsnorm_residual_kernel");
}

}  // namespace hearth
