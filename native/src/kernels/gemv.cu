// Small-batch matrix-vector product for decode: out[r, n] = sum_k x[r, k] * w[n, k], fp32
// accumulation, for up to kGemvMaxRows rows. Memory-bound on w, so the kernel is built to keep
// many weight bytes in flight: each lane issues four 16-byte streaming loads (L1 bypassed) before
// it uses any, and each weight load serves every batch row. Rows with few outputs are split along
// k over up to 8 warps of a block (partial sums combined in shared memory in a fixed order), so a
// 4096-output projection still fills the GPU. The split depends on (n, k) alone: a row's result is
// bit-identical whatever the batch size, so batched decoding equals unbatched decoding.
// At 2-8 rows each warp computes 4 output features per pass: an activation chunk read from L1
// serves 4 weight rows, so L1 traffic and load issue per weight byte drop 4x (they, not HBM,
// limited batch 8 to ~20 % of bandwidth with one feature per pass).
// Weights are bf16 or fp16 (WeightView): 8 per 16-byte load either way, converted to fp32 in
// registers; a stored fp16 weight carries the tensor's power-of-two scale, which multiplies each
// finished sum (exact), so both formats give the fp32 product of the true weights.
// NVFP4 weights go to gemv_nvfp4.cu (tensor cores), with the same fusions (gemv_params.cuh).
// Launched with PDL (launch.cuh): before waiting for the previous kernel, each lane prefetches its
// first weight chunks into L2, so the weight stream is already flowing when the activations land.
// SwiGLU variant (launch_gemv_swiglu): the fused gate/up weight [gate rows; up rows] is walked so
// that each block computes gate rows i.. and the matching up rows, and writes silu(gate) * up
// (the swiglu kernel's expression) instead of both products: one kernel and one round trip of the
// [rows, 2 * inter] intermediate fewer per layer; each product's sum is the same as unfused.
// Rope variant (launch_gemv_rope), the same idea for the fused qkv weight: each block computes dim
// i and dim i + hd/2 of the same heads and stores them rotated (rope.cuh), so the rope kernel and
// the qkv intermediate go away at <= 4 rows.
#include <type_traits>

#include "gemv_params.cuh"
#include "rope.cuh"
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

constexpr int kValsPerLoad = 8;  // inputs covered by one 16-byte weight load (bf16 or fp16)

// acc[f][r] += dot(8 weights of feature f, x[r, 8c : 8c + 8]) for F features at once: each
// activation chunk is loaded once (from L1) and used for the F weight rows. The expression per
// (feature, row) is the same whatever F and R, so a feature's sum does not depend on either.
// NORM: the chunk is first normalized as rmsnorm.cu does (x * inv_rms * weight).
__device__ __forceinline__ float2 pair_to_float2(const __nv_bfloat162& v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 pair_to_float2(const __half2& v) { return __half22float2(v); }

template <typename W, int R, int F, bool NORM>
__device__ __forceinline__ void fma8(const uint4 (&raw)[F], const float* __restrict__ x, int k,
                                     int c, float (&acc)[F][R], const bf16* __restrict__ norm_w,
                                     const float* inv_rms) {
  using Pair = std::conditional_t<std::is_same_v<W, bf16>, __nv_bfloat162, __half2>;
  float wf[F][8];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const Pair* pairs = reinterpret_cast<const Pair*>(&raw[f]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = pair_to_float2(pairs[e]);
      wf[f][2 * e] = v.x;
      wf[f][2 * e + 1] = v.y;
    }
  }
  float nw[8];
  if constexpr (NORM) {
    const uint4 raw_w = __ldg(reinterpret_cast<const uint4*>(norm_w) + c);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw_w);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = __bfloat1622float2(pairs[e]);
      nw[2 * e] = v.x;
      nw[2 * e + 1] = v.y;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k) + 2 * c;
    float4 a = __ldg(xr), b = __ldg(xr + 1);
    if constexpr (NORM) {
      const float inv = inv_rms[r];
      a = make_float4(a.x * inv * nw[0], a.y * inv * nw[1], a.z * inv * nw[2], a.w * inv * nw[3]);
      b = make_float4(b.x * inv * nw[4], b.y * inv * nw[5], b.z * inv * nw[6], b.w * inv * nw[7]);
    }
#pragma unroll
    for (int f = 0; f < F; ++f)
      acc[f][r] += wf[f][0] * a.x + wf[f][1] * a.y + wf[f][2] * a.z + wf[f][3] * a.w +
                   wf[f][4] * b.x + wf[f][5] * b.y + wf[f][6] * b.z + wf[f][7] * b.w;
  }
}

// The weight row of virtual feature v. Plain: v. Paired modes (P features per block): the first
// P / 2 features of a block are the first members of P / 2 consecutive pairs, the next P / 2 the
// matching second members. SwiGLU (n = 2 * inter): pair j = (gate row j, up row j). Rope (head
// size 2 * half): pair j = (dim d, dim d + half) of head j / half, d = j % half.
template <int MODE, int P>
__device__ __forceinline__ int weight_row(int v, int n, int half) {
  if constexpr (!(MODE & (kModeSwiglu | kModeRope))) {
    return v;
  } else {
    const int block = v / P, j = v % P;
    const bool second = j >= P / 2;
    const int pair = block * (P / 2) + (second ? j - P / 2 : j);
    if constexpr (MODE & kModeSwiglu) return second ? n / 2 + pair : pair;
    return (pair / half) * 2 * half + pair % half + (second ? half : 0);
  }
}

// Block: kGemvWarps warps = (kGemvWarps / WPR) groups of F output features x WPR warps along k.
// Every lane walks the chunks c = begin + lane, + 32, ... in ascending order, whatever F: a
// feature's partial sums, their warp reduction and the fixed-order k-split sum do not depend on F.
template <typename W, int R, int WPR, int F, int MODE>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvParams prm) {
  constexpr bool SWIGLU = MODE & kModeSwiglu, NORM = MODE & kModeNorm, RESID = MODE & kModeResidual;
  constexpr bool ROPE = MODE & kModeRope, PAIRED = SWIGLU || ROPE;
  constexpr int kGroups = kGemvWarps / WPR;
  constexpr int kPerBlock = kGroups * F;  // output features per block
  constexpr int U = F >= kGemvUnroll ? 1 : kGemvUnroll / F;  // F * U loads in flight per lane
  const int n = prm.n, k = prm.k;
  const float* __restrict__ x = prm.x;
  float* __restrict__ out = prm.out;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int f0 = (blockIdx.x * kGroups + warp / WPR) * F;
  const int part = warp % WPR;
  const int vecs = k / kValsPerLoad;  // 16-byte weight loads per row
  const int per = (vecs + WPR - 1) / WPR;
  const int begin = part * per;
  const int end = f0 < n ? min(vecs, begin + per) : begin;  // idle warp: no work, still syncs
  const uint4* wrow[F];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const size_t row = (size_t)weight_row<MODE, kPerBlock>(min(f0 + f, n - 1), n, prm.rope.head_dim / 2);
    wrow[f] = reinterpret_cast<const uint4*>(prm.w) + row * vecs;
  }
  // Weights never change during a forward pass: start their stream before the previous kernel ends.
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int f = 0; f < F; ++f)
      if (begin + lane + 32 * u < end) prefetch_l2(wrow[f] + begin + lane + 32 * u);
  pdl_wait();
  pdl_launch_dependents();

  // NORM: each row's 1 / rms from the producer's per-block sums of squares, summed by one warp per
  // row in a fixed order (the same whatever the batch).
  __shared__ float inv_rms[NORM ? R : 1];
  if constexpr (NORM) {
    for (int r = warp; r < R; r += kGemvWarps) {
      float sq = 0.f;
      for (int i = lane; i < prm.norm_count; i += 32) sq += prm.norm_partials[(size_t)r * prm.norm_count + i];
      sq = warp_sum(sq);
      if (lane == 0) inv_rms[r] = rsqrtf(sq / (float)k + prm.eps);
    }
    __syncthreads();
  }

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
    for (int u = 0; u < U; ++u)
      fma8<W, R, F, NORM>(raw[u], x, k, c + 32 * u, acc, prm.norm_weight, inv_rms);
  }
  for (; c < end; c += 32) {
    uint4 raw[F];
#pragma unroll
    for (int f = 0; f < F; ++f) raw[f] = load_stream(wrow[f] + c);
    fma8<W, R, F, NORM>(raw, x, k, c, acc, prm.norm_weight, inv_rms);
  }

#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = warp_sum(acc[f][r]);
  // SwiGLU / rope: the block's products gather here, then each pair is combined.
  __shared__ float fused[PAIRED ? kPerBlock : 1][R];
  // Residual: each writing lane's sum of squares of its new values, per row.
  float sq[RESID ? R : 1] = {};
  const int local0 = f0 - blockIdx.x * kPerBlock;
  // The one place a finished product goes (scaled back to the true weights here).
  const float w_scale = prm.w_scale;
  auto emit = [&](int f, int r, float v) {
    v *= w_scale;
    if constexpr (PAIRED) {
      fused[local0 + f][r] = v;
    } else if constexpr (RESID) {
      float* o = out + (size_t)r * n + f0 + f;
      const float nv = *o + v;
      *o = nv;
      sq[r] += nv * nv;
    } else {
      out[(size_t)r * n + f0 + f] = v;
    }
  };
  if constexpr (WPR == 1) {
    if (lane == 0)
#pragma unroll
      for (int f = 0; f < F; ++f)
        if (f0 + f < n)
#pragma unroll
          for (int r = 0; r < R; ++r) emit(f, r, acc[f][r]);
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
        if constexpr (RESID) {  // r is not a compile-time index here
#pragma unroll
          for (int rr = 0; rr < R; ++rr)
            if (rr == r) emit(f, rr, v);
        } else {
          emit(f, r, v);
        }
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
  if constexpr (ROPE) {
    __syncthreads();
    const int half = prm.rope.head_dim / 2;
    for (int i = threadIdx.x; i < kPerBlock / 2 * R; i += blockDim.x) {
      const int j = i / R, r = i - j * R;
      const int pair = blockIdx.x * (kPerBlock / 2) + j;
      rope_store(prm.rope, r, pair / half, pair % half, fused[j][r], fused[j + kPerBlock / 2][r]);
    }
  }
  if constexpr (RESID) {  // the block's sums of squares, in warp order
    __shared__ float sq_warp[kGemvWarps][R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(sq[r]);
      if (lane == 0) sq_warp[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < R) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kGemvWarps; ++w) v += sq_warp[w][threadIdx.x];
      prm.resid_partials[(size_t)threadIdx.x * gridDim.x + blockIdx.x] = v;
    }
  }
}

template <typename W, int R, int MODE>
void launch_rows(const GemvParams& prm, int wpr, cudaStream_t stream) {
  constexpr int F = R == 1 ? 1 : 4;  // gemv_features_per_warp
  const int per_block = kGemvWarps / wpr * F;  // output features per block
  const int blocks = (int)(((size_t)prm.n + per_block - 1) / per_block);
  switch (wpr) {
    case 1: launch_pdl(gemv_kernel<W, R, 1, F, MODE>, blocks, kGemvThreads, 0, stream, prm); break;
    case 2: launch_pdl(gemv_kernel<W, R, 2, F, MODE>, blocks, kGemvThreads, 0, stream, prm); break;
    case 4: launch_pdl(gemv_kernel<W, R, 4, F, MODE>, blocks, kGemvThreads, 0, stream, prm); break;
    default: launch_pdl(gemv_kernel<W, R, 8, F, MODE>, blocks, kGemvThreads, 0, stream, prm); break;
  }
}

template <typename W, int MODE>
void launch_mode(const GemvParams& prm, int rows, int wpr, cudaStream_t stream) {
  // The rope mode runs at <= kGemvRopeMaxRows rows (gemv_rope_supported): no kernels beyond.
  constexpr int kMaxRows = (MODE & kModeRope) ? kGemvRopeMaxRows : kGemvMaxRows;
  auto at = [&](auto r) {
    if constexpr (decltype(r)::value <= kMaxRows)
      launch_rows<W, decltype(r)::value, MODE>(prm, wpr, stream);
  };
  switch (rows) {
    case 1: at(std::integral_constant<int, 1>{}); break;
    case 2: at(std::integral_constant<int, 2>{}); break;
    case 3: at(std::integral_constant<int, 3>{}); break;
    case 4: at(std::integral_constant<int, 4>{}); break;
    case 5: at(std::integral_constant<int, 5>{}); break;
    case 6: at(std::integral_constant<int, 6>{}); break;
    case 7: at(std::integral_constant<int, 7>{}); break;
    default: at(std::integral_constant<int, 8>{}); break;
  }
}

template <typename W>
void launch_format(const GemvParams& prm, int rows, int mode, WeightFormat format, cudaStream_t stream) {
  const int wpr = gemv_warps_per_row(prm.n, prm.k, format);
  switch (mode) {
    case 0: launch_mode<W, 0>(prm, rows, wpr, stream); break;
    case kModeSwiglu: launch_mode<W, kModeSwiglu>(prm, rows, wpr, stream); break;
    case kModeNorm: launch_mode<W, kModeNorm>(prm, rows, wpr, stream); break;
    case kModeNorm | kModeSwiglu: launch_mode<W, kModeNorm | kModeSwiglu>(prm, rows, wpr, stream); break;
    case kModeResidual: launch_mode<W, kModeResidual>(prm, rows, wpr, stream); break;
    case kModeNorm | kModeRope: launch_mode<W, kModeNorm | kModeRope>(prm, rows, wpr, stream); break;
    default: throw std::invalid_argument("gemv: unsupported combination of fusions");
  }
}

// The product of one launch, any mode and weight format; n is the number of products (2 * inter
// for SwiGLU).
void launch_any(GemvParams prm, const WeightView& w, int rows, int mode, cudaStream_t stream) {
  HEARTH_REQUIRE(gemv_k_supported(prm.k, w.format), "gemv: k must be a multiple of 8 (32 for NVFP4)");
  switch (w.format) {
    case WeightFormat::Fp16: launch_format<f16>(prm, rows, mode, w.format, stream); break;
    case WeightFormat::NvFp4: launch_gemv_nvfp4(prm, w.block_scales, rows, mode, stream); return;
    default: launch_format<bf16>(prm, rows, mode, w.format, stream); break;
  }
  HEARTH_CHECK_LAUNCH("gemv_kernel");
}

// Puts `fast` (when given) into prm.
void with_fast(GemvParams& prm, const GemvFast* fast) {
  if (!fast) return;
  HEARTH_REQUIRE(fast->scale > 0.f && (!fast->amax || fast->amax_count > 0), "gemv: bad fast operand");
  prm.fast = true;
  prm.x_scale = fast->scale;
  prm.x_amax = fast->amax;
  prm.x_amax_count = fast->amax_count;
  prm.amax_out = fast->amax_out;
}

// Puts `norm` (when given) into prm; the mode bit it adds.
int with_norm(GemvParams& prm, const GemvNorm* norm) {
  if (!norm) return 0;
  HEARTH_REQUIRE(norm->weight && norm->partials && norm->count > 0, "gemv: bad norm fusion");
  prm.norm_weight = norm->weight;
  prm.norm_partials = norm->partials;
  prm.norm_count = norm->count;
  prm.eps = norm->eps;
  return kModeNorm;
}

}  // namespace

bool gemv_k_supported(int k, WeightFormat format) {
  return k > 0 && k % (format == WeightFormat::NvFp4 ? 32 : 8) == 0;
}

int gemv_warps_per_row(int n, int k, WeightFormat format) {
  // Split along k while the GPU holds fewer than ~16k warps of work and each warp keeps at least
  // 128 loads (2 KB) per lane group to stream. (NVFP4: 8, always: gemv_nvfp4.cu.)
  if (format == WeightFormat::NvFp4) return kGemvWarps;
  int wpr = 1;
  const int vecs = k / 8;
  while (wpr < kGemvWarps && (long long)n * wpr < 16384 && vecs / (wpr * 2) >= 128) wpr *= 2;
  return wpr;
}

int gemv_features_per_warp(int rows) { return rows <= 1 ? 1 : 4; }

int gemv_blocks(int rows, int n, int k, WeightFormat format) {
  if (format == WeightFormat::NvFp4) return gemv_nvfp4_blocks(rows, n);
  const int per_block = kGemvWarps / gemv_warps_per_row(n, k, format) * gemv_features_per_warp(rows);
  return (n + per_block - 1) / per_block;
}

void launch_gemv(const float* x, const WeightView& w, float* out, int rows, int n, int k,
                 cudaStream_t stream, const GemvNorm* norm, const GemvResidual* residual,
                 const GemvFast* fast) {
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && n > 0 && k > 0, "gemv: bad shape");
  GemvParams prm{x, w.data, w.scale, out, n, k, nullptr, nullptr, 0, 0.f, nullptr, {}};
  with_fast(prm, fast);
  int mode = with_norm(prm, norm);
  if (residual) {
    HEARTH_REQUIRE(residual->partials && !norm, "gemv: bad residual fusion");
    prm.resid_partials = residual->partials;
    mode |= kModeResidual;
  }
  launch_any(prm, w, rows, mode, stream);
}

// The paired modes (weight_row): each block's features must be whole pairs, n / 2 pairs in all.
bool pairs_fill_blocks(int rows, int n, int k, WeightFormat format) {
  if (format == WeightFormat::NvFp4) return n % 2 == 0;  // its tiles take any count of pairs
  const int per_block = kGemvWarps / gemv_warps_per_row(n, k, format) * gemv_features_per_warp(rows);
  return per_block % 2 == 0 && (n / 2) % (per_block / 2) == 0;
}

bool gemv_swiglu_supported(int rows, int inter, int k, WeightFormat format) {
  if (rows < 1 || rows > kGemvMaxRows || inter <= 0 || !gemv_k_supported(k, format)) return false;
  return pairs_fill_blocks(rows, 2 * inter, k, format);
}

void launch_gemv_swiglu(const float* x, const WeightView& w_gate_up, float* out, int rows,
                        int inter, int k, cudaStream_t stream, const GemvNorm* norm,
                        const GemvFast* fast) {
  HEARTH_REQUIRE(gemv_swiglu_supported(rows, inter, k, w_gate_up.format),
                 "gemv_swiglu: shape not supported (check gemv_swiglu_supported first)");
  GemvParams prm{x, w_gate_up.data, w_gate_up.scale, out, 2 * inter, k, nullptr, nullptr, 0, 0.f,
                 nullptr, {}};
  with_fast(prm, fast);
  const int mode = kModeSwiglu | with_norm(prm, norm);
  launch_any(prm, w_gate_up, rows, mode, stream);
}

bool gemv_rope_supported(int rows, int n, int k, WeightFormat format) {
  if (rows < 1 || rows > kGemvRopeMaxRows || n <= 0 || n % 2 != 0 || !gemv_k_supported(k, format))
    return false;
  return pairs_fill_blocks(rows, n, k, format);
}

void launch_gemv_rope(const float* x, const WeightView& w_qkv, int rows, int n, int k,
                      cudaStream_t stream, const GemvNorm& norm, const RopeTarget& rope,
                      const GemvFast* fast) {
  HEARTH_REQUIRE(gemv_rope_supported(rows, n, k, w_qkv.format) && rope.head_dim % 2 == 0 &&
                     n == (rope.heads + 2 * rope.kv_heads) * rope.head_dim,
                 "gemv_rope: shape not supported (check gemv_rope_supported first)");
  GemvParams prm{x, w_qkv.data, w_qkv.scale, nullptr, n, k, nullptr, nullptr, 0, 0.f, nullptr, rope};
  with_fast(prm, fast);
  const int mode = kModeRope | with_norm(prm, &norm);
  launch_any(prm, w_qkv, rows, mode, stream);
}

}  // namespace hearth
