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
#include "../env.h"
#include "../launch.cuh"
#include "gemv_params.cuh"
#include "nvfp4_mma.cuh"
#include "rope.cuh"

namespace hearth {

namespace {

using nvfp4_mma::kStepInputs;

// Steps in flight per warp: 2 (a lane already copies 2-4 chunks per step).
constexpr int kRingDepth = 2;
template <int FT, int D>
using Stream = nvfp4_mma::WeightStream<FT, D>;
template <int FT, int W, int D = kRingDepth>
constexpr int ring_bytes() { return W * Stream<FT, D>::kWarpBytes; }

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

template <int FT, int W, int MODE, bool FAST, bool STAGE, int D, bool PERSIST>
__global__ void __launch_bounds__(W * 32, PERSIST && W == 8 ? 3 : 1) gemv_nvfp4_kernel(GemvParams prm, const uint8_t* __restrict__ block_scales,
                                                              int rows) {
  constexpr bool SWIGLU = MODE & kModeSwiglu, NORM = MODE & kModeNorm, RESID = MODE & kModeResidual;
  constexpr bool ROPE = MODE & kModeRope;
  constexpr int kFeatures = 16 * FT;  // mma rows per block tile
  constexpr int kWarps = W, kThreads = W * 32;
  extern __shared__ __align__(16) unsigned char ring[];
  const int n = prm.n, k = prm.k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int my_steps = warp < steps ? (steps - 1 - warp) / kWarps + 1 : 0;  // steps warp, warp + W, ...
  const int half = ROPE ? prm.rope.head_dim / 2 : 1;
  // Block tiles (kFeatures weight rows each): one a block, or (PERSIST) tiles blockIdx.x,
  // blockIdx.x + gridDim.x, ... for a grid of one wave, whose warps stream the next tile's first
  // steps while the current tile's sums meet. Each tile's outputs, and its per-tile partials (amax,
  // sums of squares), are those of a one-tile block: the same bits whatever the grid.
  const int tiles = (n + kFeatures - 1) / kFeatures;
  const int my_tiles = PERSIST ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 1;
  auto tile_of = [&](int u) { return (int)blockIdx.x + u * (int)gridDim.x; };

  Stream<FT, D> ws;
  ws.init(ring + warp * Stream<FT, D>::kWarpBytes, lane, k);
  auto row_of = [&](int bt, int i, int h) { return (size_t)tile_row<MODE>(bt * FT + i, g, h, n, half); };
  auto set_source = [&](int bt) {
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t row = row_of(bt, i, h);
        ws.set_source(i, h, static_cast<const uint8_t*>(prm.w) + row * (k / 2), block_scales + row * (k / 16));
      }
  };
  auto set_shift = [&](int bt) {
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) ws.set_shift(i, h, block_scales + row_of(bt, i, h) * (k / 16));
  };
  // PERSIST: the issue cursor runs over the warp's steps of its tiles in order, D ahead of the multiplies.
  int issue_u = 0, issue_j = 0;
  auto issue_next = [&](int slot) {
    if (issue_u < my_tiles && my_steps > 0) {
      ws.issue(warp + issue_j * kWarps, slot);
      if (++issue_j == my_steps) {
        issue_j = 0;
        if (++issue_u < my_tiles) set_source(tile_of(issue_u));
      }
    }
  };
  if constexpr (PERSIST) {
    set_source(tile_of(0));
    set_shift(tile_of(0));
  } else {
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t row = row_of(blockIdx.x, i, h);
        ws.set_row(i, h, static_cast<const uint8_t*>(prm.w) + row * (k / 2), block_scales + row * (k / 16));
      }
  }
  // Weights never change: their first steps are requested before the wait.
#pragma unroll
  for (int d = 0; d < D; ++d) {
    if constexpr (PERSIST) issue_next(d);
    else if (d < my_steps) ws.issue(warp + d * kWarps, d);
    nvfp4_mma::cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();

  // NORM: each row's 1 / rms from the producer's per-block sums of squares (a fixed-order sum, the
  // same whatever the batch); the weight of the norm multiplies the activations, 1 / rms the sums
  // (FAST: the activations too, with 1 / x_scale, before they become fp16).
  // FAST: row_in[r] multiplies row r's activations before fp16, row_out[r] its finished sums.
  __shared__ float inv_rms[kGemvMaxRows], row_in[kGemvMaxRows], row_out[kGemvMaxRows];
  __shared__ unsigned row_max[kGemvMaxRows];  // FAST SwiGLU: the tile's max |y| per row (float bits)
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
  unsigned char* stage = ring + ring_bytes<FT, W, D>();
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
  const int stage_row = min(g, rows - 1);
  // acc[i] = (tile row g, batch 2t, 2t + 1), (tile row g + 8, batch 2t, 2t + 1); the warps' sums
  // meet here and are added in warp order. STAGE without PERSIST: they meet in the ring, free once
  // every warp is past its last step (static shared memory freed for a deeper ring).
  constexpr bool kPartInRing = STAGE && !PERSIST;
  __shared__ float part_static[kPartInRing ? 1 : kWarps][kFeatures][kGemvMaxRows];
  using Part = float[kFeatures][kGemvMaxRows];
  Part* part = kPartInRing ? reinterpret_cast<Part*>(ring) : part_static;
  static_assert(!kPartInRing || sizeof(float) * kWarps * kFeatures * kGemvMaxRows <= ring_bytes<FT, W, D>());
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

  // Step j of the current tile from ring step `slot` into acc (the inputs of step j + 1 requested
  // first where they come from L2).
  auto multiply_step = [&](int j, int slot, float (&acc)[FT][4], float4 (&xnext)[8], uint4 (&nnext)[4]) {
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
    nvfp4_mma::cp_async_wait<D - 1>();  // this step's group (D groups committed since it)
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
  };

  // Block tile bt's sums: the warps' partials meet, then the epilogue of MODE writes its outputs.
  auto finish_tile = [&](int bt, const float (&acc)[FT][4]) {
    if constexpr (kPartInRing) __syncthreads();
#pragma unroll
    for (int i = 0; i < FT; ++i) {
      part[warp][16 * i + g][2 * t] = acc[i][0];
      part[warp][16 * i + g][2 * t + 1] = acc[i][1];
      part[warp][16 * i + g + 8][2 * t] = acc[i][2];
      part[warp][16 * i + g + 8][2 * t + 1] = acc[i][3];
    }
    __syncthreads();
    if constexpr (SWIGLU || ROPE) {
      const int pairs = n / 2;
      for (int q = threadIdx.x; q < 8 * FT * rows; q += kThreads) {
        const int lp = q / rows, r = q - lp * rows;
        const int i = lp / 8, gg = lp % 8;
        const int pair = (bt * FT + i) * 8 + gg;
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
          prm.amax_out[(size_t)threadIdx.x * tiles + bt] = __uint_as_float(row_max[threadIdx.x]);
        if (PERSIST && threadIdx.x < rows) row_max[threadIdx.x] = 0u;  // read above by this thread alone
      }
    } else if constexpr (RESID) {
      __shared__ float scratch[32];
      const int f = bt * kFeatures + threadIdx.x;
      for (int r = 0; r < rows; ++r) {
        float sq = 0.f;
        if (threadIdx.x < kFeatures && f < n) {
          float* o = prm.out + (size_t)r * n + f;
          const float nv = *o + total(threadIdx.x, r);
          *o = nv;
          sq = nv * nv;
        }
        sq = block_sum(sq, scratch);
        if (threadIdx.x == 0) prm.resid_partials[(size_t)r * tiles + bt] = sq;
      }
    } else {
      for (int q = threadIdx.x; q < kFeatures * rows; q += kThreads) {
        const int f = q / rows, r = q - f * rows;
        const int feature = bt * kFeatures + f;
        if (feature < n) prm.out[(size_t)r * n + feature] = total(f, r);
      }
    }
  };

  float4 xnext[8];
  uint4 nnext[4];
  if constexpr (PERSIST) {
    static_assert(STAGE, "the persistent grid reads staged activations");
    int slot = 0;  // the ring step the next multiply reads (steps are consumed in issue order)
    for (int u = 0; u < my_tiles; ++u) {
      const int bt = tile_of(u);
      if (u > 0) set_shift(bt);
      float acc[FT][4] = {};
      for (int j = 0; j < my_steps; ++j) {
        multiply_step(j, slot, acc, xnext, nnext);
        issue_next(slot);  // into the slot just read: the step D ahead, maybe the next tile's
        nvfp4_mma::cp_async_commit();
        slot = slot + 1 == D ? 0 : slot + 1;
      }
      finish_tile(bt, acc);
      __syncthreads();  // the sums read before the next tile's are written
    }
  } else {
    float acc[FT][4] = {};
    // Step j + 1's inputs are requested before step j is multiplied: they come from L2, and a request
    // issued at the top of its own step stalled the warp for the round trip (8B NVFP4 batch-1 decode
    // step, H200: 3,701 -> 3,185 us; docs/BENCHMARKS.md).
    if constexpr (!STAGE) load_inputs(0, xnext, nnext);
    // Unrolled by the ring's depth, so each step's slot is a constant.
    for (int j0 = 0; j0 < my_steps; j0 += D) {
#pragma unroll
      for (int slot = 0; slot < D; ++slot) {
        const int j = j0 + slot;
        if (j >= my_steps) break;
        multiply_step(j, slot, acc, xnext, nnext);
        // The slot is free once its values are multiplied: the step D ahead goes into it.
        if (j + D < my_steps) ws.issue(warp + (j + D) * kWarps, slot);
        nvfp4_mma::cp_async_commit();
      }
    }
    finish_tile(blockIdx.x, acc);
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

template <int FT, int W, int MODE, bool FAST, bool STAGE, int D = kRingDepth, bool PERSIST = false>
void launch_precision(const GemvParams& prm, const uint8_t* scales, int rows, int stage_bytes, cudaStream_t stream) {
  constexpr auto kernel = gemv_nvfp4_kernel<FT, W, MODE, FAST, STAGE, D, PERSIST>;
  const int tiles = (prm.n + 16 * FT - 1) / (16 * FT);
  // The ring (and the staged rows) are dynamic shared memory; with the static arrays they may pass
  // the default 48 KB, never the device's limit (the launcher stages only what fits: stage_fits).
  static const bool sized = [] {
    constexpr int kMaxDynamic = ring_bytes<FT, W, D>() + (STAGE ? kStageMaxBytes : 0);
    const int room = smem_per_block_optin() - static_bytes_bound<FT, W>();
    HEARTH_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     std::max(std::min(kMaxDynamic, room), ring_bytes<FT, W, D>())));
    return true;
  }();
  (void)sized;
  const int smem = ring_bytes<FT, W, D>() + stage_bytes;
  int blocks = tiles;
  if constexpr (PERSIST) {  // one wave: the blocks an SM holds at this shared memory, times the SMs
    static int asked_smem[16] = {}, per_sm[16] = {};  // by shared memory; asked once, before any capture
    int slot = 0;
    while (slot < 15 && asked_smem[slot] && asked_smem[slot] != smem) ++slot;
    if (asked_smem[slot] != smem) {
      HEARTH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[slot], kernel, W * 32, smem));
      asked_smem[slot] = smem;
    }
    blocks = std::min(tiles, std::max(per_sm[slot], 1) * sm_count());
  }
  launch_pdl(kernel, blocks, W * 32, smem, stream, prm, scales, rows);
}

// Whether `rows` staged rows of `stage_bytes` fit the device beside the ring and the static arrays:
// always on Hopper (227 KB) and A100; on Ada and consumer Ampere (99 KB) not at 16 warps a block past
// a few KB, where the ring alone takes 80 KB.
template <int FT, int W, int D = kRingDepth>
bool stage_fits(int stage_bytes) {
  return stage_bytes <= kStageMaxBytes &&
         ring_bytes<FT, W, D>() + stage_bytes + static_bytes_bound<FT, W>() <= smem_per_block_optin();
}

// A/B switch (temporary): HEARTH_GEMV_DEPTH=3|4, the staged kernel's ring depth (default 2).
int stage_depth() {
  static const int d = env_is("HEARTH_GEMV_DEPTH", "4") ? 4 : env_is("HEARTH_GEMV_DEPTH", "3") ? 3 : 2;
  return d;
}
// A/B switch (temporary): HEARTH_GEMV_PERSIST=1, the staged kernel's blocks take tiles in a grid of one
// wave (depths 2 and 4).
bool stage_persist() {
  static const bool on = env_is("HEARTH_GEMV_PERSIST", "1");
  return on;
}

template <int FT, int W, int MODE>
void launch_kernel(const GemvParams& prm, const uint8_t* scales, int rows, cudaStream_t stream) {
  if (prm.fast) {
    // Staged where the rows fit (stage_fits), at 2 tiles a warp (4 tiles' ring already takes half an
    // SM's shared memory: staging would cost the second block).
    const int stage_bytes = rows * ((prm.k + kStepInputs - 1) / kStepInputs) * kStageStepBytes;
    if constexpr (FT == 2) {
      const int depth = stage_depth();
      if (depth == 4 && stage_fits<FT, W, 4>(stage_bytes)) {
        if (stage_persist()) return launch_precision<FT, W, MODE, true, true, 4, true>(prm, scales, rows, stage_bytes, stream);
        return launch_precision<FT, W, MODE, true, true, 4>(prm, scales, rows, stage_bytes, stream);
      }
      if (depth == 3 && stage_fits<FT, W, 3>(stage_bytes))
        return launch_precision<FT, W, MODE, true, true, 3>(prm, scales, rows, stage_bytes, stream);
      if (stage_fits<FT, W>(stage_bytes)) {
        if (stage_persist()) return launch_precision<FT, W, MODE, true, true, 2, true>(prm, scales, rows, stage_bytes, stream);
        return launch_precision<FT, W, MODE, true, true>(prm, scales, rows, stage_bytes, stream);
      }
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
