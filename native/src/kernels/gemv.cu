// Small-batch matrix-vector product for decode: out[r, n] = sum_k x[r, k] * w[n, k], fp32
// accumulation, for up to kGemvMaxRows rows. Memory-bound on w, so the kernel is built to keep
// many weight bytes in flight: each lane issues four 16-byte streaming loads (L1 bypassed) before
// it uses any, and each weight load serves every batch row. Rows with few outputs are split along
// k over up to 8 warps of a block (partial sums combined in shared memory in a fixed order), so a
// 4096-output projection still fills the GPU. The split depends on (n, k) alone: a row's result is
// bit-identical whatever the batch size, so batched decoding equals unbatched decoding.
// At 2-8 rows each warp computes 4 output features per pass (HEARTH_GEMV_FEATURES=1: one, the
// earlier kernel): an activation chunk read from L1 serves 4 weight rows, so L1 traffic and load
// issue per weight byte drop 4x (they, not HBM, limited batch 8 to ~20 % of bandwidth).
// Launched with PDL (launch.cuh): before waiting for the previous kernel, each lane prefetches its
// first weight chunks into L2, so the weight stream is already flowing when the activations land.
// SwiGLU variant (launch_gemv_swiglu): the fused gate/up weight [gate rows; up rows] is walked so
// that each block computes gate rows i.. and the matching up rows, and writes silu(gate) * up
// (the swiglu kernel's expression) instead of both products: one kernel and one round trip of the
// [rows, 2 * inter] intermediate fewer per layer; each product's sum is the same as unfused.
#include <cstdlib>

#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

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

// acc[f][r] += dot(8 weights of feature f, x[r, 8c : 8c + 8]) for F features at once: each
// activation chunk is loaded once (from L1) and used for the F weight rows. The expression per
// (feature, row) is the same whatever F and R, so a feature's sum does not depend on either.
template <int R, int F>
__device__ __forceinline__ void fma8(const uint4 (&raw)[F], const float* __restrict__ x, int k,
                                     int c, float (&acc)[F][R]) {
  float wf[F][8];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[f]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = __bfloat1622float2(pairs[e]);
      wf[f][2 * e] = v.x;
      wf[f][2 * e + 1] = v.y;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k) + 2 * c;
    const float4 a = __ldg(xr), b = __ldg(xr + 1);
#pragma unroll
    for (int f = 0; f < F; ++f)
      acc[f][r] += wf[f][0] * a.x + wf[f][1] * a.y + wf[f][2] * a.z + wf[f][3] * a.w +
                   wf[f][4] * b.x + wf[f][5] * b.y + wf[f][6] * b.z + wf[f][7] * b.w;
  }
}

// Block: kGemvWarps warps = (kGemvWarps / WPR) groups of F output features x WPR warps along k.
// Every lane walks the chunks c = begin + lane, + 32, ... in ascending order, whatever F: a
// feature's partial sums, their warp reduction and the fixed-order k-split sum do not depend on F.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// The weight row of virtual feature v. Plain: v. SwiGLU (n = 2 * inter, P features per block):
// the first P / 2 features of a block are gate rows, the next P / 2 the matching up rows.
template <bool SWIGLU, int P>
__device__ __forceinline__ int weight_row(int v, int n) {
  if constexpr (!SWIGLU) {
    return v;
  } else {
    const int block = v / P, j = v % P;
    return j < P / 2 ? block * (P / 2) + j : n / 2 + block * (P / 2) + (j - P / 2);
  }
}

template <int R, int WPR, int F, bool SWIGLU = false>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const float* __restrict__ x,
                                                           const bf16* __restrict__ w,
                                                           float* __restrict__ out, int n, int k) {
  constexpr int kGroups = kGemvWarps / WPR;
  constexpr int kPerBlock = kGroups * F;  // output features per block
  constexpr int U = F >= kGemvUnroll ? 1 : kGemvUnroll / F;  // F * U loads in flight per lane
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f0 = (blockIdx.x * kGroups + warp / WPR) * F;
  const int part = warp % WPR;
  const int vecs = k / 8;
  const int per = (vecs + WPR - 1) / WPR;
  const int begin = part * per;
  const int end = f0 < n ? min(vecs, begin + per) : begin;  // idle warp: no work, still syncs
  const uint4* wrow[F];
#pragma unroll
  for (int f = 0; f < F; ++f)
    wrow[f] = reinterpret_cast<const uint4*>(
        w + (size_t)weight_row<SWIGLU, kPerBlock>(min(f0 + f, n - 1), n) * k);
  // Weights never change during a forward pass: start their stream before the previous kernel ends.
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int f = 0; f < F; ++f)
      if (begin + lane + 32 * u < end) prefetch_l2(wrow[f] + begin + lane + 32 * u);
  pdl_wait();
  pdl_launch_dependents();

  float acc[F][R];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.f;
  int c = begin + lane;
  for (; c + 32 * (U - 1) < end; c += 32 * U) {
    uint4 raw[U][F];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int f = 0; f < F; ++f) raw[u][f] = load_stream(wrow[f] + c + 32 * u);
#pragma unroll
    for (int u = 0; u < U; ++u) fma8<R, F>(raw[u], x, k, c + 32 * u, acc);
  }
  for (; c < end; c += 32) {
    uint4 raw[F];
#pragma unroll
    for (int f = 0; f < F; ++f) raw[f] = load_stream(wrow[f] + c);
    fma8<R, F>(raw, x, k, c, acc);
  }

#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = warp_sum(acc[f][r]);
  // SwiGLU: the block's products gather here, then gate and up are combined.
  __shared__ float fused[SWIGLU ? kPerBlock : 1][R];
  const int local0 = f0 - blockIdx.x * kPerBlock;
  if constexpr (WPR == 1) {
    if (lane == 0)
#pragma unroll
      for (int f = 0; f < F; ++f)
        if (f0 + f < n)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if constexpr (SWIGLU)
              fused[local0 + f][r] = acc[f][r];
            else
              out[(size_t)r * n + f0 + f] = acc[f][r];
          }
  } else {
    __shared__ float partial[kGemvWarps][F][R];
    if (lane == 0)
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int r = 0; r < R; ++r) partial[warp][f][r] = acc[f][r];
    __syncthreads();
    if (part == 0) {
      for (int i = lane; i < F * R; i += 32) {
        const int f = i / R, r = i - f * R;
        if (f0 + f >= n) continue;
        float v = 0.f;
#pragma unroll
        for (int p = 0; p < WPR; ++p) v += partial[warp + p][f][r];
        if constexpr (SWIGLU)
          fused[local0 + f][r] = v;
        else
          out[(size_t)r * n + f0 + f] = v;
      }
    }
  }
  if constexpr (SWIGLU) {
    __syncthreads();
    const int inter = n / 2;
    for (int i = threadIdx.x; i < kPerBlock / 2 * R; i += blockDim.x) {
      const int j = i / R, r = i - j * R;
      const float g = fused[j][r], u = fused[j + kPerBlock / 2][r];
      out[(size_t)r * inter + blockIdx.x * (kPerBlock / 2) + j] = g / (1.f + expf(-g)) * u;
    }
  }
}

template <int R, int F, bool SWIGLU>
void launch_rows(const float* x, const bf16* w, float* out, int n, int k, int wpr,
                 cudaStream_t stream) {
  const int per_block = kGemvWarps / wpr * F;  // output features per block
  const int blocks = (int)(((size_t)n + per_block - 1) / per_block);
  switch (wpr) {
#define HEARTH_GEMV_WPR(W)                                                                  \
  case W:                                                                                  \
    launch_pdl(gemv_kernel<R, W, F, SWIGLU>, blocks, kGemvThreads, 0, stream, x, w, out, n, k); \
    break;
    HEARTH_GEMV_WPR(1) HEARTH_GEMV_WPR(2) HEARTH_GEMV_WPR(4)
    default: launch_pdl(gemv_kernel<R, 8, F, SWIGLU>, blocks, kGemvThreads, 0, stream, x, w, out, n, k);
#undef HEARTH_GEMV_WPR
  }
}

template <int R, bool SWIGLU = false>
void launch_rows(const float* x, const bf16* w, float* out, int n, int k, int wpr, int features,
                 cudaStream_t stream) {
  if constexpr (R == 1) {
    launch_rows<1, 1, SWIGLU>(x, w, out, n, k, wpr, stream);
  } else {
    if (features >= 4)
      launch_rows<R, 4, SWIGLU>(x, w, out, n, k, wpr, stream);
    else
      launch_rows<R, 1, SWIGLU>(x, w, out, n, k, wpr, stream);
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

int gemv_features_per_warp(int rows) {
  if (rows <= 1) return 1;
  const char* v = std::getenv("HEARTH_GEMV_FEATURES");
  return (v && std::atoi(v) == 1) ? 1 : 4;
}

void launch_gemv(const float* x, const bf16* w, float* out, int rows, int n, int k,
                 cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && n > 0 && k > 0, "gemv: bad shape");
  HEARTH_REQUIRE(k % 8 == 0, "gemv: k must be a multiple of 8");
  const int wpr = gemv_warps_per_row(n, k);
  const int features = gemv_features_per_warp(rows);
  switch (rows) {
#define HEARTH_GEMV_CASE(R) \
  case R: launch_rows<R>(x, w, out, n, k, wpr, features, stream); break;
    HEARTH_GEMV_CASE(1) HEARTH_GEMV_CASE(2) HEARTH_GEMV_CASE(3) HEARTH_GEMV_CASE(4)
    HEARTH_GEMV_CASE(5) HEARTH_GEMV_CASE(6) HEARTH_GEMV_CASE(7) HEARTH_GEMV_CASE(8)
#undef HEARTH_GEMV_CASE
  }
  HEARTH_CHECK_LAUNCH("gemv_kernel");
}

bool gemv_swiglu_supported(int rows, int inter, int k) {
  if (rows < 1 || rows > kGemvMaxRows || inter <= 0 || k % 8 != 0) return false;
  const int per_block = kGemvWarps / gemv_warps_per_row(2 * inter, k) * gemv_features_per_warp(rows);
  return per_block % 2 == 0 && inter % (per_block / 2) == 0;
}

void launch_gemv_swiglu(const float* x, const bf16* w_gate_up, float* out, int rows, int inter,
                        int k, cudaStream_t stream) {
  HEARTH_REQUIRE(gemv_swiglu_supported(rows, inter, k),
                 "gemv_swiglu: shape not supported (check gemv_swiglu_supported first)");
  const int n = 2 * inter;
  const int wpr = gemv_warps_per_row(n, k);
  const int features = gemv_features_per_warp(rows);
  switch (rows) {
#define HEARTH_GEMV_CASE(R) \
  case R: launch_rows<R, true>(x, w_gate_up, out, n, k, wpr, features, stream); break;
    HEARTH_GEMV_CASE(1) HEARTH_GEMV_CASE(2) HEARTH_GEMV_CASE(3) HEARTH_GEMV_CASE(4)
    HEARTH_GEMV_CASE(5) HEARTH_GEMV_CASE(6) HEARTH_GEMV_CASE(7) HEARTH_GEMV_CASE(8)
#undef HEARTH_GEMV_CASE
  }
  HEARTH_CHECK_LAUNCH("gemv_kernel (swiglu)");
}

}  // namespace hearth
