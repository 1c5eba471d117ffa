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
// Values: a code placed into bf16 bits is e2m1 * 2^-126 exactly; times the block scale * 2^119
// (bf16, exact) it is e2m1 * scale * 2^-7, exact (<= 6 significant bits, far from subnormal); the
// activation is split into bf16 hi + lo (two products), so the sum carries ~16 bits of the
// activation: well inside the fast precision's bar (float64 check: ~3e-6 relative).
// The 8 warps of a block split the steps (warp w takes steps w, w + 8, ...) and add their partial
// sums in warp order: a row's result depends on (n, k) alone, not on the batch or on FT, so batched
// decoding equals unbatched decoding.
#include "../common.cuh"
#include "../launch.cuh"
#include "gemv_params.cuh"
#include "rope.cuh"

namespace hearth {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStepInputs = 128;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Codes I and I + 4 of a word (code j in bits 4j .. 4j + 3) as a bf16 pair, each e2m1 * 2^-126:
// the sign to bit 15, the three magnitude bits to bits 6-8 (the exponent's low two bits and the
// mantissa's first), in both halves at once.
template <int I>
__device__ __forceinline__ uint32_t e2m1_pair_bf16(uint32_t word) {
  const uint32_t s = word << (12 - 4 * I);
  return (s & 0x80008000u) | ((s & 0x70007000u) >> 6);
}

// Two e4m3 block scales (the low two bytes of u) times 2^119, in fp32: the bytes placed into fp16
// bits give scale * 2^-8 exactly, subnormal scales included.
__device__ __forceinline__ float2 block_scales_2p119(uint32_t u) {
  const uint32_t bits = ((u & 0x7Fu) << 7) | ((u & 0x80u) << 8) | ((u & 0x7F00u) << 15) | ((u & 0x8000u) << 16);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
  return make_float2(f.x * 0x1p127f, f.y * 0x1p127f);
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t bf16_mul2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

template <int FT, int MODE>
__global__ void __launch_bounds__(kThreads) gemv_nvfp4_kernel(GemvParams prm, const uint8_t* __restrict__ block_scales,
                                                              int rows) {
  constexpr bool SWIGLU = MODE & kModeSwiglu, NORM = MODE & kModeNorm, RESID = MODE & kModeResidual;
  constexpr bool ROPE = MODE & kModeRope;
  constexpr int kFeatures = 16 * FT;  // mma rows per block
  const int n = prm.n, k = prm.k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int half = ROPE ? prm.rope.head_dim / 2 : 1;

  const uint4* wrow[FT][2];
  const uint16_t* srow[FT][2];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t row = (size_t)tile_row<MODE>(blockIdx.x * FT + i, g, h, n, half);
      wrow[i][h] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(prm.w) + row * (k / 2));
      srow[i][h] = reinterpret_cast<const uint16_t*>(block_scales + row * (k / 16));
      if (warp < steps) prefetch_l2(wrow[i][h] + warp * 4 + t);  // weights never change: start early
    }
  pdl_wait();
  pdl_launch_dependents();

  // NORM: each row's 1 / rms from the producer's per-block sums of squares (a fixed-order sum, the
  // same whatever the batch); the weight of the norm multiplies the activations, 1 / rms the sums.
  __shared__ float inv_rms[kGemvMaxRows];
  if constexpr (NORM) {
    for (int r = warp; r < rows; r += kWarps) {
      float sq = 0.f;
      for (int i = lane; i < prm.norm_count; i += 32) sq += prm.norm_partials[(size_t)r * prm.norm_count + i];
      sq = warp_sum(sq);
      if (lane == 0) inv_rms[r] = rsqrtf(sq / (float)k + prm.eps);
    }
  }

  const bool has_x = g < rows;
  const float* xr = prm.x + (size_t)min(g, rows - 1) * k;
  float acc[FT][4];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  for (int s = warp; s < steps; s += kWarps) {
    const int in0 = s * kStepInputs + 32 * t;  // this lane's first input of the step
    const bool ok = in0 < k;                    // k is a multiple of 32: a lane's 32 are all in or out
    uint4 w[FT][2];
    uint32_t sc[FT][2];
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        w[i][h] = ok ? load_stream(wrow[i][h] + s * 4 + t) : make_uint4(0, 0, 0, 0);
        sc[i][h] = ok ? (uint32_t)__ldg(srow[i][h] + s * 4 + t) : 0u;
      }
    const float4* xp = reinterpret_cast<const float4*>(xr + in0);
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {  // word wd: inputs in0 + 8 wd .. + 7, block scale wd / 2
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
      if (ok && has_x) {
        a = __ldg(xp + 2 * wd);
        b = __ldg(xp + 2 * wd + 1);
        if constexpr (NORM) {
          const uint4 raw = __ldg(reinterpret_cast<const uint4*>(prm.norm_weight + in0 + 8 * wd));
          const __nv_bfloat162* nw = reinterpret_cast<const __nv_bfloat162*>(&raw);
          const float2 n0 = __bfloat1622float2(nw[0]), n1 = __bfloat1622float2(nw[1]);
          const float2 n2 = __bfloat1622float2(nw[2]), n3 = __bfloat1622float2(nw[3]);
          a = make_float4(a.x * n0.x, a.y * n0.y, a.z * n1.x, a.w * n1.y);
          b = make_float4(b.x * n2.x, b.y * n2.y, b.z * n3.x, b.w * n3.y);
        }
      }
      // Activation pairs (input j, input j + 4) as the codes pair up; hi + lo carry ~16 bits.
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        hi[p] = bf16_pair(av[p], bv[p]);
        lo[p] = bf16_pair(av[p] - __uint_as_float(hi[p] << 16), bv[p] - __uint_as_float(hi[p] & 0xFFFF0000u));
      }
#pragma unroll
      for (int i = 0; i < FT; ++i) {
        uint32_t P[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 sf = block_scales_2p119(sc[i][h]);
          const float sv = wd < 2 ? sf.x : sf.y;
          const uint32_t S = bf16_pair(sv, sv);
          const uint32_t q = (&w[i][h].x)[wd];
          P[h][0] = bf16_mul2(e2m1_pair_bf16<0>(q), S);
          P[h][1] = bf16_mul2(e2m1_pair_bf16<1>(q), S);
          P[h][2] = bf16_mul2(e2m1_pair_bf16<2>(q), S);
          P[h][3] = bf16_mul2(e2m1_pair_bf16<3>(q), S);
        }
        // A: rows g / g + 8 at k slots (2t, 2t + 1) and (2t + 8, 2t + 9); B: the same slots.
        mma_bf16(acc[i], P[0][0], P[1][0], P[0][1], P[1][1], hi[0], hi[1]);
        mma_bf16(acc[i], P[0][2], P[1][2], P[0][3], P[1][3], hi[2], hi[3]);
        mma_bf16(acc[i], P[0][0], P[1][0], P[0][1], P[1][1], lo[0], lo[1]);
        mma_bf16(acc[i], P[0][2], P[1][2], P[0][3], P[1][3], lo[2], lo[3]);
      }
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
  const float scale = prm.w_scale * 128.f;  // the global scale, and the 2^-7 of the decoded weights
  auto total = [&](int f, int r) {
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kWarps; ++p) v += part[p][f][r];
    v *= scale;
    if constexpr (NORM) v *= inv_rms[r];
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
        prm.out[(size_t)r * pairs + pair] = first / (1.f + expf(-first)) * second;
      } else {
        rope_store(prm.rope, r, pair / half, pair % half, first, second);
      }
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

// Tiles per warp: one up to 4 rows; beyond, the activations' conversion (done once per warp) is
// shared by 2 or 4 tiles (H200, 8 rows: gate_up 89 -> 40 us with 4, qkv 19.5 -> 16.3).
int tiles_per_warp(int rows, int n) { return rows <= 4 ? 1 : n >= 16384 ? 4 : 2; }

template <int FT>
void launch_tiles(const GemvParams& prm, const uint8_t* scales, int rows, int mode, cudaStream_t stream) {
  const int blocks = (prm.n + 16 * FT - 1) / (16 * FT);
  switch (mode) {
    case 0: launch_pdl(gemv_nvfp4_kernel<FT, 0>, blocks, kThreads, 0, stream, prm, scales, rows); break;
    case kModeSwiglu: launch_pdl(gemv_nvfp4_kernel<FT, kModeSwiglu>, blocks, kThreads, 0, stream, prm, scales, rows); break;
    case kModeNorm: launch_pdl(gemv_nvfp4_kernel<FT, kModeNorm>, blocks, kThreads, 0, stream, prm, scales, rows); break;
    case kModeNorm | kModeSwiglu:
      launch_pdl(gemv_nvfp4_kernel<FT, kModeNorm | kModeSwiglu>, blocks, kThreads, 0, stream, prm, scales, rows);
      break;
    case kModeResidual: launch_pdl(gemv_nvfp4_kernel<FT, kModeResidual>, blocks, kThreads, 0, stream, prm, scales, rows); break;
    case kModeNorm | kModeRope:
      launch_pdl(gemv_nvfp4_kernel<FT, kModeNorm | kModeRope>, blocks, kThreads, 0, stream, prm, scales, rows);
      break;
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
  switch (tiles_per_warp(rows, prm.n)) {
    case 1: launch_tiles<1>(prm, block_scales, rows, mode, stream); break;
    case 2: launch_tiles<2>(prm, block_scales, rows, mode, stream); break;
    default: launch_tiles<4>(prm, block_scales, rows, mode, stream); break;
  }
  HEARTH_CHECK_LAUNCH("gemv_nvfp4_kernel");
}

}  // namespace hearth
