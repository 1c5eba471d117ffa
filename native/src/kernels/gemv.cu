// Small-batch matrix-vector product for decode: out[r, n] = sum_k x[r, k] * w[n, k], fp32
// accumulation, for up to kGemvMaxRows rows. Memory-bound on w: one warp per output feature
// streams its weight row in 16-byte loads, each load reused for every batch row; the fp32
// activations are small and stay in cache.
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

__device__ __forceinline__ void unpack8(const uint4& raw, float* f) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 v = __bfloat1622float2(pairs[e]);
    f[2 * e] = v.x;
    f[2 * e + 1] = v.y;
  }
}

template <int R>
__global__ void __launch_bounds__(256) gemv_kernel(const float* __restrict__ x,
                                                   const bf16* __restrict__ w,
                                                   float* __restrict__ out, int n, int k) {
  const int feature = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (feature >= n) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + (size_t)feature * k);
  const int vecs = k / 8;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 4
  for (int c = lane; c < vecs; c += 32) {
    float wf[8];
    unpack8(__ldg(wrow + c), wf);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k) + 2 * c;
      const float4 a = __ldg(xr), b = __ldg(xr + 1);
      acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                wf[6] * b.z + wf[7] * b.w;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) out[(size_t)r * n + feature] = v;
  }
}

void launch_gemv(const float* x, const bf16* w, float* out, int rows, int n, int k,
                 cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && n > 0 && k > 0, "gemv: bad shape");
  HEARTH_REQUIRE(k % 8 == 0, "gemv: k must be a multiple of 8");
  const int threads = 256;
  const int blocks = (int)(((size_t)n * 32 + threads - 1) / threads);
  switch (rows) {
#define HEARTH_GEMV_CASE(R) \
  case R: gemv_kernel<R><<<blocks, threads, 0, stream>>>(x, w, out, n, k); break;
    HEARTH_GEMV_CASE(1) HEARTH_GEMV_CASE(2) HEARTH_GEMV_CASE(3) HEARTH_GEMV_CASE(4)
    HEARTH_GEMV_CASE(5) HEARTH_GEMV_CASE(6) HEARTH_GEMV_CASE(7) HEARTH_GEMV_CASE(8)
#undef HEARTH_GEMV_CASE
  }
  HEARTH_CHECK_LAUNCH("gemv_kernel");
}

}  // namespace hearth
