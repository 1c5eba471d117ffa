// Small-batch matrix-vector product for decode: out[r, n] = sum_k x[r, k] * w[n, k], fp32
// accumulation, for up to kGemvMaxRows rows. Memory-bound on w, so the kernel is built to keep
// many weight bytes in flight: each lane issues four 16-byte streaming loads (L1 bypassed) before
// it uses any, and each weight load serves every batch row. Rows with few outputs are split along
// k over up to 8 warps of a block (partial sums combined in shared memory in a fixed order), so a
// 4096-output projection still fills the GPU. The split depends on (n, k) alone: a row's result is
// bit-identical whatever the batch size, so batched decoding equals unbatched decoding.
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvUnroll = 4;  // 16-byte loads in flight per lane

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <int R>
__device__ __forceinline__ void fma8(const uint4& raw, const float* __restrict__ x, int k, int c,
                                     float* acc) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float wf[8];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 v = __bfloat1622float2(pairs[e]);
    wf[2 * e] = v.x;
    wf[2 * e + 1] = v.y;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k) + 2 * c;
    const float4 a = __ldg(xr), b = __ldg(xr + 1);
    acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
              wf[6] * b.z + wf[7] * b.w;
  }
}

// Block: kGemvWarps warps = (kGemvWarps / WPR) output features x WPR warps along k each.
template <int R, int WPR>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const float* __restrict__ x,
                                                           const bf16* __restrict__ w,
                                                           float* __restrict__ out, int n, int k) {
  constexpr int kFeatures = kGemvWarps / WPR;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int feature = blockIdx.x * kFeatures + warp / WPR;
  const int part = warp % WPR;
  const int vecs = k / 8;
  const int per = (vecs + WPR - 1) / WPR;
  const int begin = part * per;
  const int end = feature < n ? min(vecs, begin + per) : begin;  // idle warp: no work, still syncs
  const uint4* wrow = reinterpret_cast<const uint4*>(w + (size_t)min(feature, n - 1) * k);

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  int c = begin + lane;
  for (; c + 32 * (kGemvUnroll - 1) < end; c += 32 * kGemvUnroll) {
    uint4 raw[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) raw[u] = load_stream(wrow + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) fma8<R>(raw[u], x, k, c + 32 * u, acc);
  }
  for (; c < end; c += 32) fma8<R>(load_stream(wrow + c), x, k, c, acc);

#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if constexpr (WPR == 1) {
    if (lane == 0 && feature < n)
#pragma unroll
      for (int r = 0; r < R; ++r) out[(size_t)r * n + feature] = acc[r];
  } else {
    __shared__ float partial[kGemvWarps][R];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) partial[warp][r] = acc[r];
    __syncthreads();
    if (part == 0 && lane < R && feature < n) {
      float v = 0.f;
#pragma unroll
      for (int p = 0; p < WPR; ++p) v += partial[warp + p][lane];
      out[(size_t)lane * n + feature] = v;
    }
  }
}

template <int R>
void launch_rows(const float* x, const bf16* w, float* out, int n, int k, int wpr,
                 cudaStream_t stream) {
  const int blocks = (int)(((size_t)n * wpr + kGemvWarps - 1) / kGemvWarps);
  switch (wpr) {
    case 1: gemv_kernel<R, 1><<<blocks, kGemvThreads, 0, stream>>>(x, w, out, n, k); break;
    case 2: gemv_kernel<R, 2><<<blocks, kGemvThreads, 0, stream>>>(x, w, out, n, k); break;
    case 4: gemv_kernel<R, 4><<<blocks, kGemvThreads, 0, stream>>>(x, w, out, n, k); break;
    default: gemv_kernel<R, 8><<<blocks, kGemvThreads, 0, stream>>>(x, w, out, n, k); break;
  }
}

}  // namespace

int gemv_warps_per_row(int n, int k) {
  // Split along k while the GPU holds fewer than ~16k warps of work and each warp keeps at least
  // 128 loads (2 KB) per lane group to stream.
  int wpr = 1;
  const int vecs = k / 8;
  while (wpr < kGemvWarps && (long long)n * wpr < 16384 && vecs / (wpr * 2) >= 128) wpr *= 2;
  return wpr;
}

void launch_gemv(const float* x, const bf16* w, float* out, int rows, int n, int k,
                 cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && n > 0 && k > 0, "gemv: bad shape");
  HEARTH_REQUIRE(k % 8 == 0, "gemv: k must be a multiple of 8");
  const int wpr = gemv_warps_per_row(n, k);
  switch (rows) {
#define HEARTH_GEMV_CASE(R) \
  case R: launch_rows<R>(x, w, out, n, k, wpr, stream); break;
    HEARTH_GEMV_CASE(1) HEARTH_GEMV_CASE(2) HEARTH_GEMV_CASE(3) HEARTH_GEMV_CASE(4)
    HEARTH_GEMV_CASE(5) HEARTH_GEMV_CASE(6) HEARTH_GEMV_CASE(7) HEARTH_GEMV_CASE(8)
#undef HEARTH_GEMV_CASE
  }
  HEARTH_CHECK_LAUNCH("gemv_kernel");
}

}  // namespace hearth
