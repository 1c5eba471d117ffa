// The NVFP4 decode GEMV (up to kGemvMaxRows rows), on tensor cores: out[r, n] = sum_k x[r, k] w[n, k]
// with w's e2m1 codes and e4m3 block scales read once, in place (no repacking), and the fusions of
// gemv.cu (norm, SwiGLU, rope, residual: gemv_params.cuh).
//
// Why tensor cores at one row: decoding codes in registers and multiplying in fp32 (the first
// kernel) spent ~7 instructions per weight and reached 0.4-0.5 TB/s of the 4 TB/s the H200 reads;
// here a code costs ~2 (bit placement into bf16, one bf16 multiply by its block scale) and the
// products are mma.sync's (m16n8k16, fp32 accumulation): 3x faster on the 8B's projections
// (docs/BENCHMARKS.md; tests/cuda/test_kernels.py::test_gemv_nvfp4_bandwidth_8b_shapes prints it).
//
// Layout of one warp's work: a tile of 16 weight rows (the mma's A, rows g and g + 8 for lane
// group g = lane / 4) times the batch rows (the mma's B columns, 8; batch row g is lane group g's).
// A "step" is 128 inputs: lane t = lane % 4 of a group reads 16 bytes (32 codes, inputs 32t ..
// 32t + 31) of each of its two rows and the matching 32 activations of its batch row. The sum over
// k is order-free, so each mma's 16 k slots take the inputs that one word decodes into (codes j
// and j + 4 of a word make one bf16 pair), with the activations paired the same way.
// Values, exact precision: a code placed into bf16 bits is e2m1 * 2^-126 exactly; times the block
// scale * 2^119 (bf16, exact) it is e2m1 * scale * 2^-7, exact (<= 6 significant bits, far from
// subnormal); the activation is split into bf16 hi + lo (two products), so the sum carries ~16 bits
// of the activation (float64 check: ~3e-6 relative). Fast precision (GemvParams::fast): one fp16
// product, the code as fp16 e2m1 * 2^-14 times the block scale (exact down to fp16's smallest
// subnormal), the activation divided by a power of two that keeps it in fp16's range (after the
// norm: the load-time bound; else the row's max |x|, from its producer's per-block partials, which
// the SwiGLU epilogue leaves), as the fast cuBLASLt product takes them.
// The W warps of a block (8, or 16 where the blocks do not fill the GPU: warps_per_block) split the
// steps (warp w takes steps w, w + W, ...) and add their partial sums in warp order: a row's result
// depends on (n, k) alone, not on the batch or on FT, so batched decoding equals unbatched decoding.
// Loads: a warp keeps its next D steps of codes and scales in flight (nvfp4_mma::WeightStream,
// cp.async into shared memory), and issues its first D before pdl_wait(), while the kernel before
// it still runs. The first tensor-core version loaded each step just before multiplying it (one
// 16-byte load in flight per lane) and streamed 1.5 of the H200's 4.2 TB/s. The activations: at the
// fast precision, where the rows fit (STAGE below), converted once a block into shared memory (8B
// decode step at one row 3,259 -> 3,044 us, H100; docs/BENCHMARKS.md); else (and the norm's weight)
// from L2 one step ahead, in registers.
#include <algorithm>

#include "../common.cuh"
#include "../launch.cuh"
#include "gemv_params.cuh"
#include "nvfp4_mma.cuh"
#include "rope.cuh"

namespace hearth {

namespace {

using nvfp4_mma::kStepInputs;

// Steps in flight per warp: 2 (a lane already copies 2-4 chunks per step).
constexpr int kRingDepth = 2;
template <int FT>
using Stream = nvfp4_mma::WeightStream<FT, kRingDepth>;
template <int FT, int W>
constexpr int ring_bytes() { return W * Stream<FT>::kWarpBytes; }

// Staged activations (STAGE, fast precision only): the block's rows converted once into fp16 pairs in
// shared memory, after the ring, in the order a lane reads them: row r, step s, quad lane t, word wd
// (16 bytes: inputs 8 wd + p and 8 wd + p + 4 of the lane's 32, p = 0..3). A word's 16-byte slot is
// swizzled by t's bit 1 and the row's parity, so the 8 lanes of an LDS.128 phase (two rows, four t)
// read 8 distinct bank groups. Unstaged, each of a warp's 8 lane groups loads and converts its own
// batch row every step: at one row 8 times the same work, a quarter of the step's instructions.
constexpr int kStageStepBytes = 256;        // a row's step: 4 lanes x 4 words x 16 bytes
constexpr int kStageMaxBytes = 32 * 1024;   // down (14336 inputs) at one row is 28 KB

// A block's static shared memory, bounded: the warps' partial sums (the part array below) and, with
// room to spare, the per-row scalars and the residual's scratch.
template <int FT, int W>
constexpr int static_bytes_bound() { return W * 16 * FT * kGemvMaxRows * 4 + 1024; }
// The dynamic shared memory (ring and staged rows) a block may take on this device beside them.
template <int FT, int W>
int dynamic_bytes_room() { return smem_per_block_optin() - static_bytes_bound<FT, W>(); }

__device__ __forceinline__ int stage_offset(int r, int s, int t, int wd, int steps) {
  return (r * steps + s) * kStageStepBytes + t * 64 + ((wd ^ ((t >> 1) & 1) ^ ((r & 1) << 1)) * 16);
}

// Eight consecutive activations (a: the first four, b: the next) times the norm's weight there (8 bf16).
__device__ __forceinline__ void times_norm_weight(float4& a, float4& b, uint4 weight) {
  const __nv_bfloat162* nw = reinterpret_cast<const __nv_bfloat162*>(&weight);
  const float2 n0 = __bfloat1622float2(nw[0]), n1 = __bfloat1622float2(nw[1]);
  const float2 n2 = __bfloat1622float2(nw[2]), n3 = __bfloat1622float2(nw[3]);
  a = make_float4(a.x * n0.x, a.y * n0.y, a.z * n1.x, a.w * n1.y);
  b = make_float4(b.x * n2.x, b.y * n2.y, b.z * n3.x, b.w * n3.y);
}

// The weight row that half h (0: mma rows 0-7, 1: rows 8-15) of tile `tile` gives lane group g.
// Plain: 16 consecutive rows per tile. Paired modes: the tile's 8 pairs, first members in rows
// 0-7, second members in rows 8-15, so one lane holds both products of a pair. SwiGLU pair j =
// (gate j, up j); rope pair j = (dim d, dim d + half) of head j / half, d = j % half.
template <int MODE>
__device__ __forceinline__ int tile_row(int tile, int g, int h, int n, int half) {
  if constexpr (!(MODE & (kModeSwiglu | kModeRope))) {
    return min(16 * tile + g + 8 * h, n - 1);
  } else {
    const int pair = min(8 * tile + g, n / 2 - 1);
    if constexpr (MODE & kModeSwiglu) return pair + h * (n / 2);
    return (pair / half) * 2 * half + pair % half + h * half;
  }
}

template <int FT, int W, int MODE, bool FAST, bool STAGE>
__global__ void __launch_bounds__(W * 32) gemv_nvfp4_kernel(GemvParams prm, const uint8_t* __restrict__ block_scales,
                                                              int rows) {
  constexpr bool SWIGLU = MODE & kModeSwiglu, NORM = MODE & kModeNorm, RESID = MODE & kModeResidual;
  constexpr bool ROPE = MODE & kModeRope;
  constexpr int kFeatures = 16 * FT;  // mma rows per block
  constexpr int D = kRingDepth;
  constexpr int kWarps = W, kThreads = W * 32;
  extern __shared__ __align__(16) unsigned char ring[];
  const int n = prm.n, k = prm.k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int my_steps = warp < steps ? (steps - 1 - warp) / kWarps + 1 : 0;  // steps warp, warp + W, ...
  const int half = ROPE ? prm.rope.head_dim / 2 : 1;

  Stream<FT> ws;
  ws.init(ring + warp * Stream<FT>::kWarpBytes, lane, k);
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t row = (size_t)tile_row<MODE>(blockIdx.x * FT + i, g, h, n, half);
      ws.set_row(i, h, static_cast<const uint8_t*>(prm.w) + row * (k / 2), block_scales + row * (k / 16));
    }
  // Weights never change: their first steps are requested before the wait.
#pragma unroll
  for (int d = 0; d < D; ++d) {
    if (d < my_steps) ws.issue(warp + d * kWarps, d);
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();

  // NORM: each row's 1 / rms from the producer's per-block sums of squares (a fixed-order sum, the
  // same whatever the batch); the weight of the norm multiplies the activations, 1 / rms the sums
  // (FAST: the activations too, with 1 / x_scale, before they become fp16).
  // FAST: row_in[r] multiplies row r's activations before fp16, row_out[r] its finished sums.
  __shared__ float inv_rms[kGemvMaxRows], row_in[kGemvMaxRows], row_out[kGemvMaxRows];
  __shared__ unsigned row_max[kGemvMaxRows];  // FAST SwiGLU: the block's max |y| per row (float bits)
  for (int r = warp; r < rows; r += kWarps) {
    if constexpr (NORM) {
      float sq = 0.f;
      for (int i = lane; i < prm.norm_count; i += 32) sq += prm.norm_partials[(size_t)r * prm.norm_count + i];
      sq = warp_sum(sq);
      if (lane == 0) inv_rms[r] = rsqrtf(sq / (float)k + prm.eps);
      if (FAST && lane == 0) row_in[r] = inv_rms[r] / prm.x_scale, row_out[r] = prm.x_scale;
    } else if constexpr (FAST) {
      float s = prm.x_scale;
      if (prm.x_amax) {  // a max, so the same whatever the partials' blocks
        float m = 0.f;
        for (int i = lane; i < prm.x_amax_count; i += 32) m = fmaxf(m, prm.x_amax[(size_t)r * prm.x_amax_count + i]);
        s = nvfp4_mma::operand_scale(warp_max(m));
      }
      if (lane == 0) row_in[r] = 1.f / s, row_out[r] = s;
    }
    if (lane == 0) row_max[r] = 0u;
  }
  if constexpr (FAST) __syncthreads();

  // STAGE: every row's activations, as the unstaged loop prepares them (the same products in the same
  // order, so the same bits), once for the block; zeros past k, as the ring's codes there.
  unsigned char* stage = ring + ring_bytes<FT, W>();
  if constexpr (STAGE) {
    const int chunks = steps * 16;  // 8 inputs each, a row padded to whole steps
    for (int q = threadIdx.x; q < rows * chunks; q += kThreads) {
      const int r = q / chunks, c = q - r * chunks, in0 = 8 * c;
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
      if (in0 < k) {
        const float4* xp = reinterpret_cast<const float4*>(prm.x + (size_t)r * k + in0);
        float4 a = __ldg(xp), b = __ldg(xp + 1);
        if constexpr (NORM) times_norm_weight(a, b, __ldg(reinterpret_cast<const uint4*>(prm.norm_weight + in0)));
        const float f = row_in[r];
        a = make_float4(a.x * f, a.y * f, a.z * f, a.w * f);
        b = make_float4(b.x * f, b.y * f, b.z * f, b.w * f);
        const __half2 h0 = __floats2half2_rn(a.x, b.x), h1 = __floats2half2_rn(a.y, b.y);
        const __half2 h2 = __floats2half2_rn(a.z, b.z), h3 = __floats2half2_rn(a.w, b.w);
        out = make_uint4(*reinterpret_cast<const uint32_t*>(&h0), *reinterpret_cast<const uint32_t*>(&h1),
                         *reinterpret_cast<const uint32_t*>(&h2), *reinterpret_cast<const uint32_t*>(&h3));
      }
      *reinterpret_cast<uint4*>(stage + stage_offset(r, c >> 4, (c >> 2) & 3, c & 3, steps)) = out;
    }
    __syncthreads();
  }

  const bool has_x = g < rows;
  const float* xr = prm.x + (size_t)min(g, rows - 1) * k;
  float acc[FT][4];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  // A step's inputs for this lane: 32 floats of its batch row and, with the norm, its weight there.
  auto load_inputs = [&](int j, float4 (&xv)[8], uint4 (&nv)[4]) {
    const int in0 = (warp + j * kWarps) * kStepInputs + 32 * t;
    const bool ok = j < my_steps && in0 < k && has_x;  // k is a multiple of 32: a lane's 32 are all in or out
    const float4* xp = reinterpret_cast<const float4*>(xr + in0);
#pragma unroll
    for (int q = 0; q < 8; ++q) xv[q] = ok ? __ldg(xp + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (NORM) {
      const uint4* np = reinterpret_cast<const uint4*>(prm.norm_weight + in0);
#pragma unroll
      for (int q = 0; q < 4; ++q) nv[q] = ok ? __ldg(np + q) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // Step j + 1's inputs are requested before step j is multiplied: they come from L2, and a request
  // issued at the top of its own step stalled the warp for the round trip (8B NVFP4 batch-1 decode
  // step, H200: 3,701 -> 3,185 us; docs/BENCHMARKS.md).
  float4 xnext[8];
  uint4 nnext[4];
  if constexpr (!STAGE) load_inputs(0, xnext, nnext);
  const int stage_row = min(g, rows - 1);

  // Unrolled by the ring's depth, so each step's slot is a constant.
  for (int j0 = 0; j0 < my_steps; j0 += D) {
#pragma unroll
    for (int slot = 0; slot < D; ++slot) {
      const int j = j0 + slot;
      if (j >= my_steps) break;
      const int s = warp + j * kWarps;
      uint4 xh[4];  // STAGE: this lane's 32 activations of the step, as fp16 pairs
      float4 xv[8];
      if constexpr (STAGE) {
#pragma unroll
        for (int wd = 0; wd < 4; ++wd)
          xh[wd] = *reinterpret_cast<const uint4*>(stage + stage_offset(stage_row, s, t, wd, steps));
      } else {
        uint4 nw4[4];
#pragma unroll
        for (int q = 0; q < 8; ++q) xv[q] = xnext[q];
#pragma unroll
        for (int q = 0; q < 4; ++q) nw4[q] = nnext[q];
        load_inputs(j + 1, xnext, nnext);
        if constexpr (NORM) {  // the norm's weight; 1 / rms multiplies the finished sums
#pragma unroll
          for (int q = 0; q < 4; ++q) times_norm_weight(xv[2 * q], xv[2 * q + 1], nw4[q]);
        }
      }
      cp_async_wait<D - 1>();  // step j's group (D + j groups committed so far)
      uint4 w[FT][2];
      uint32_t sc[FT][2];
      ws.fetch(slot, w, sc);
      if constexpr (STAGE) {
        nvfp4_mma::tile_step_f16_halves<FT>(acc, w, sc, xh);
      } else if constexpr (FAST) {
        const float f = row_in[min(g, rows - 1)];
#pragma unroll
        for (int q = 0; q < 8; ++q) xv[q] = make_float4(xv[q].x * f, xv[q].y * f, xv[q].z * f, xv[q].w * f);
        nvfp4_mma::tile_step_f16<FT>(acc, w, sc, xv);
      } else {
        nvfp4_mma::tile_step<FT>(acc, w, sc, xv);
      }
      // The slot is free once its values are multiplied: the step D ahead goes into it.
      if (j + D < my_steps) ws.issue(s + D * kWarps, slot);
      cp_async_commit();
    }
  }

  // acc[i] = (tile row g, batch 2t, 2t + 1), (tile row g + 8, batch 2t, 2t + 1); the warps' sums
  // meet here and are added in warp order.
  __shared__ float part[kWarps][kFeatures][kGemvMaxRows];
#pragma unroll
  for (int i = 0; i < FT; ++i) {
    part[warp][16 * i + g][2 * t] = acc[i][0];
    part[warp][16 * i + g][2 * t + 1] = acc[i][1];
    part[warp][16 * i + g + 8][2 * t] = acc[i][2];
    part[warp][16 * i + g + 8][2 * t + 1] = acc[i][3];
  }
  __syncthreads();
  // The global scale, and the decoded weights' 2^-7 (bf16 codes) or 2^-14 (fp16 codes).
  const float scale = prm.w_scale * (FAST ? 16384.f : 128.f);
  auto total = [&](int f, int r) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) v += part[p][f][r];
    v *= scale;
    if constexpr (FAST) v *= row_out[r];
    else if constexpr (NORM) v *= inv_rms[r];
    return v;
  };
  if constexpr (SWIGLU || ROPE) {
    const int pairs = n / 2;
    for (int q = threadIdx.x; q < 8 * FT * rows; q += kThreads) {
      const int lp = q / rows, r = q - lp * rows;
      const int i = lp / 8, gg = lp % 8;
      const int pair = (blockIdx.x * FT + i) * 8 + gg;
      if (pair >= pairs) continue;
      const float first = total(16 * i + gg, r), second = total(16 * i + gg + 8, r);
      if constexpr (SWIGLU) {
        const float y = first / (1.f + expf(-first)) * second;
        prm.out[(size_t)r * pairs + pair] = y;
        if (FAST) atomicMax(&row_max[r], __float_as_uint(fabsf(y)));  // non-negative: bits order as values
      } else {
        rope_store(prm.rope, r, pair / half, pair % half, first, second);
      }
    }
    if constexpr (FAST && SWIGLU) {
      __syncthreads();
      if (prm.amax_out && threadIdx.x < rows)
        prm.amax_out[(size_t)threadIdx.x * gridDim.x + blockIdx.x] = __uint_as_float(row_max[threadIdx.x]);
    }
  } else if constexpr (RESID) {
    __shared__ float scratch[32];
    const int f = blockIdx.x * kFeatures + threadIdx.x;
    for (int r = 0; r < rows; ++r) {
      float sq = 0.f;
      if (threadIdx.x < kFeatures && f < n) {
        float* o = prm.out + (size_t)r * n + f;
        const float nv = *o + total(threadIdx.x, r);
        *o = nv;
        sq = nv * nv;
      }
      sq = block_sum(sq, scratch);
      if (threadIdx.x == 0) prm.resid_partials[(size_t)r * gridDim.x + blockIdx.x] = sq;
    }
  } else {
    for (int q = threadIdx.x; q < kFeatures * rows; q += kThreads) {
      const int f = q / rows, r = q - f * rows;
      const int feature = blockIdx.x * kFeatures + f;
      if (feature < n) prm.out[(size_t)r * n + feature] = total(f, r);
    }
  }
}

// Warps a block: 16 where the weight's 2-tile blocks (32 rows each) do not outnumber the SMs, else 8.
// There each SM holds one block, and 8 warps left 2 a scheduler to hide the ring's latency; 16 split k
// twice as finely (8B down at one row 22.3 -> 16.8 us; the decode step 8B -2.4 to -2.8 %, 1B -4 to
// -8 %, H100 and H200; docs/BENCHMARKS.md). Where the blocks outnumber the SMs, 16 (or 12) warps lost:
// a 512-thread block takes a whole SM's registers (8B qkv: 192 blocks in two waves; the step +10 %).
// It depends on n alone, never on the rows (the sums' order follows the warps).
int warps_per_block(int n) { return (n + 31) / 32 <= sm_count() ? 16 : 8; }

// Tiles per warp (16 weight rows each): 2, or 4 where a wide weight meets several rows, so the
// activations' conversion (once per warp) is shared by more rows. Measured over 1, 2 and 4 on the
// 8B's projections (docs/BENCHMARKS.md, H200 and H100): 2 win or tie from one row everywhere but o
// at 1-2 rows (1 tile, 5 % faster, dropped for one kernel less); 4 win for gate_up (28672) at 4-8
// rows and qkv (6144) at 8 (one tile per warp up to 4 rows lost up to 42 %). Always 2 at 16 warps
// a block (4 tiles would exceed 128 registers), so a weight's warps, and a row's sums, stay the
// same at any batch.
int tiles_per_warp(int rows, int n) {
  if (warps_per_block(n) == 16) return 2;
  return (n >= 16384 && rows >= 4) || (n >= 6144 && rows >= 8) ? 4 : 2;
}

template <int FT, int W, int MODE, bool FAST, bool STAGE>
void launch_precision(const GemvParams& prm, const uint8_t* scales, int rows, int stage_bytes, cudaStream_t stream) {
  const int blocks = (prm.n + 16 * FT - 1) / (16 * FT);
  // The ring (and the staged rows) are dynamic shared memory; with the static arrays they may pass
  // the default 48 KB, never the device's limit (the launcher stages only what fits: stage_fits).
  static const bool sized = [] {
    constexpr int kMaxDynamic = ring_bytes<FT, W>() + (STAGE ? kStageMaxBytes : 0);
    HEARTH_CUDA(cudaFuncSetAttribute(gemv_nvfp4_kernel<FT, W, MODE, FAST, STAGE>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     std::max(std::min(kMaxDynamic, dynamic_bytes_room<FT, W>()), ring_bytes<FT, W>())));
    return true;
  }();
  (void)sized;
  launch_pdl(gemv_nvfp4_kernel<FT, W, MODE, FAST, STAGE>, blocks, W * 32, ring_bytes<FT, W>() + stage_bytes, stream,
             prm, scales, rows);
}

// Whether `rows` staged rows of `stage_bytes` fit the device beside the ring and the static arrays:
// always on Hopper (227 KB) and A100; on Ada and consumer Ampere (99 KB) not at 16 warps a block past
// a few KB, where the ring alone takes 80 KB.
template <int FT, int W>
bool stage_fits(int stage_bytes) {
  return stage_bytes <= kStageMaxBytes && ring_bytes<FT, W>() + stage_bytes <= dynamic_bytes_room<FT, W>();
}

template <int FT, int W, int MODE>
void launch_kernel(const GemvParams& prm, const uint8_t* scales, int rows, cudaStream_t stream) {
  if (prm.fast) {
    // Staged where the rows fit (stage_fits), at 2 tiles a warp (4 tiles' ring already takes half an
    // SM's shared memory: staging would cost the second block).
    const int stage_bytes = rows * ((prm.k + kStepInputs - 1) / kStepInputs) * kStageStepBytes;
    if constexpr (FT == 2) {
      if (stage_fits<FT, W>(stage_bytes))
        return launch_precision<FT, W, MODE, true, true>(prm, scales, rows, stage_bytes, stream);
    }
    launch_precision<FT, W, MODE, true, false>(prm, scales, rows, 0, stream);
  } else {
    launch_precision<FT, W, MODE, false, false>(prm, scales, rows, 0, stream);
  }
}

template <int FT, int W>
void launch_tiles(const GemvParams& prm, const uint8_t* scales, int rows, int mode, cudaStream_t stream) {
  switch (mode) {
    case 0: launch_kernel<FT, W, 0>(prm, scales, rows, stream); break;
    case kModeSwiglu: launch_kernel<FT, W, kModeSwiglu>(prm, scales, rows, stream); break;
    case kModeNorm: launch_kernel<FT, W, kModeNorm>(prm, scales, rows, stream); break;
    case kModeNorm | kModeSwiglu: launch_kernel<FT, W, kModeNorm | kModeSwiglu>(prm, scales, rows, stream); break;
    case kModeResidual: launch_kernel<FT, W, kModeResidual>(prm, scales, rows, stream); break;
    case kModeNorm | kModeRope: launch_kernel<FT, W, kModeNorm | kModeRope>(prm, scales, rows, stream); break;
    default: throw std::invalid_argument("gemv: unsupported combination of fusions");
  }
}

}  // namespace

int gemv_nvfp4_blocks(int rows, int n) {
  const int per_block = 16 * tiles_per_warp(rows, n);
  return (n + per_block - 1) / per_block;
}

void launch_gemv_nvfp4(const GemvParams& prm, const uint8_t* block_scales, int rows, int mode,
                       cudaStream_t stream) {
  HEARTH_REQUIRE(block_scales, "gemv: an NVFP4 weight needs its block scales");
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemvMaxRows && prm.k % 32 == 0, "gemv: bad NVFP4 shape");
  HEARTH_REQUIRE(!(mode & kModeRope) || rows <= kGemvRopeMaxRows, "gemv: rope fusion takes <= 4 rows");
  if (tiles_per_warp(rows, prm.n) == 4) launch_tiles<4, 8>(prm, block_scales, rows, mode, stream);
  else if (warps_per_block(prm.n) == 16) launch_tiles<2, 16>(prm, block_scales, rows, mode, stream);
  else launch_tiles<2, 8>(prm, block_scales, rows, mode, stream);
  HEARTH_CHECK_LAUNCH("gemv_nvfp4_kernel");
}

}  // namespace hearth
