// NVFP4 on tensor cores, shared by the decode GEMV (gemv_nvfp4.cu), the MoE expert GEMV (moe.cu)
// and the small-batch GEMM (gemm_nvfp4.cu): e2m1 codes placed into bf16 / fp16 bits, e4m3 block
// scales, the m16n8k16 mma, and WeightStream, which keeps a warp's next steps of codes and scales
// in flight through shared memory. gemv_nvfp4.cu's header says how a warp's lanes map onto the
// codes, activations and sums.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cp_async.cuh"

namespace hearth {
namespace nvfp4_mma {

constexpr int kStepInputs = 128;  // inputs per warp step: 32 per lane of a quad

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

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Codes I and I + 4 of a word as an fp16 pair, each e2m1 * 2^-14 (0.5 lands on the subnormal
// 2^-15): the sign to bit 15, the magnitude bits to bits 9-11, in both halves at once.
template <int I>
__device__ __forceinline__ uint32_t e2m1_pair_f16(uint32_t word) {
  const uint32_t s = word << (12 - 4 * I);
  return (s & 0x80008000u) | ((s & 0x70007000u) >> 3);
}

// Two e4m3 block scales (the low two bytes of u) as fp16, exact (subnormal scales included): the
// bytes placed into fp16 bits are scale * 2^-8, times 256.
__device__ __forceinline__ __half2 block_scales_f16(uint32_t u) {
  const uint32_t bits = ((u & 0x7Fu) << 7) | ((u & 0x80u) << 8) | ((u & 0x7F00u) << 15) | ((u & 0x8000u) << 16);
  return __hmul2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(256.f));
}

__device__ __forceinline__ uint32_t f16_mul2(uint32_t a, __half2 b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), b);
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

// One warp step over FT 16-row tiles: tile i's rows w[i][0] (mma rows 0-7) and w[i][1] (rows 8-15),
// this lane's 16 code bytes of each with their two block scales sc[i][.], and its 32 activations
// x[0..7] (float4s, inputs in order) of its batch row, split once for all tiles into bf16 hi + lo:
// acc[i] += tile i's products.
template <int FT>
__device__ __forceinline__ void tile_step(float (&acc)[FT][4], const uint4 (&w)[FT][2], const uint32_t (&sc)[FT][2],
                                          const float4 (&x)[8]) {
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) {  // word wd: inputs 8 wd .. 8 wd + 7, block scale wd / 2
    const float4 a = x[2 * wd], b = x[2 * wd + 1];
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // activation pairs (input j, input j + 4), as the codes pair up
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

// The fast precision's weights: each 16-row tile half's two block scales as fp16 (exact), split
// by the words they cover (words 0-1 and 2-3 of a lane's four).
template <int FT>
__device__ __forceinline__ void tile_scales_f16(const uint32_t (&sc)[FT][2], __half2 (&scale)[FT][2][2]) {
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2 both = block_scales_f16(sc[i][h]);
      scale[i][h][0] = __low2half2(both);
      scale[i][h][1] = __high2half2(both);
    }
}

// A word's 8 codes as fp16 pairs (codes j, j + 4) times their block scale: e2m1 * scale * 2^-14.
__device__ __forceinline__ void word_codes_f16(uint32_t q, __half2 sv, uint32_t (&P)[4]) {
  P[0] = f16_mul2(e2m1_pair_f16<0>(q), sv);
  P[1] = f16_mul2(e2m1_pair_f16<1>(q), sv);
  P[2] = f16_mul2(e2m1_pair_f16<2>(q), sv);
  P[3] = f16_mul2(e2m1_pair_f16<3>(q), sv);
}

// Word wd of every tile against this lane's 4 activation pairs of it (fp16, paired as the codes):
// two m16n8k16 products a tile.
template <int FT>
__device__ __forceinline__ void word_step_f16(float (&acc)[FT][4], const uint4 (&w)[FT][2],
                                              const __half2 (&scale)[FT][2][2], int wd, uint32_t x0, uint32_t x1,
                                              uint32_t x2, uint32_t x3) {
#pragma unroll
  for (int i = 0; i < FT; ++i) {
    uint32_t P[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) word_codes_f16((&w[i][h].x)[wd], scale[i][h][wd >> 1], P[h]);
    mma_f16(acc[i], P[0][0], P[1][0], P[0][1], P[1][1], x0, x1);
    mma_f16(acc[i], P[0][2], P[1][2], P[0][3], P[1][3], x2, x3);
  }
}

// tile_step for the fast precision: one fp16 product per weight. The activations (already divided
// by their operand scale) go into fp16 once per step; the codes into fp16 e2m1 * 2^-14 times the
// block scale (exact, down to fp16's smallest subnormal), so acc[i] += tile i's products * 2^-14.
template <int FT>
__device__ __forceinline__ void tile_step_f16(float (&acc)[FT][4], const uint4 (&w)[FT][2],
                                              const uint32_t (&sc)[FT][2], const float4 (&x)[8]) {
  __half2 scale[FT][2][2];
  tile_scales_f16<FT>(sc, scale);
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) {
    const float4 a = x[2 * wd], b = x[2 * wd + 1];
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    uint32_t xh[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // (input j, input j + 4), as the codes pair up
      const __half2 v = __floats2half2_rn(av[p], bv[p]);
      xh[p] = *reinterpret_cast<const uint32_t*>(&v);
    }
    word_step_f16<FT>(acc, w, scale, wd, xh[0], xh[1], xh[2], xh[3]);
  }
}

// tile_step_f16 with the activations already in fp16 pairs: xh[wd] = (input 8 wd + p, 8 wd + p + 4),
// p = 0..3, of this lane's 32, as tile_step_f16 pairs them (the GEMV's staged activations, gemv_nvfp4.cu).
template <int FT>
__device__ __forceinline__ void tile_step_f16_halves(float (&acc)[FT][4], const uint4 (&w)[FT][2],
                                                     const uint32_t (&sc)[FT][2], const uint4 (&xh)[4]) {
  __half2 scale[FT][2][2];
  tile_scales_f16<FT>(sc, scale);
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) word_step_f16<FT>(acc, w, scale, wd, xh[wd].x, xh[wd].y, xh[wd].z, xh[wd].w);
}

// ---- many rows: fp16 activations staged in shared memory, shared by a block's warps ----
// A staged activation row holds one step (128 inputs, fp16) in 16 chunks of 8 inputs, chunk c at
// slot (c % 4) * 4 + c / 4 (a lane's word wd, quad lane t, is slot 4 wd + t), rows 256 bytes apart,
// odd rows with the slot's bit 2 flipped: the 8 lanes of an LDS.128 phase (rows g, g + 1; t = 0..3;
// one word) then read both 64-byte halves of the 128 banks' bytes, 8 distinct 16-byte groups. Rows
// 320 bytes apart did the same with a fifth of the stage unused: the 64-row stages then kept a
// second block of the small-batch product off the multiprocessor.
constexpr int kStagedRowBytes = 256;

__device__ __forceinline__ int staged_slot_offset(int row, int slot) {
  return row * kStagedRowBytes + ((slot ^ ((row & 1) << 2)) * 16);
}

__device__ __forceinline__ int staged_chunk_offset(int row, int chunk) {
  return staged_slot_offset(row, (chunk & 3) * 4 + (chunk >> 2));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// One step of FT 16-row tiles (this lane's codes w and scales sc, as WeightStream fetches them) over
// NB groups of 8 staged rows (the mma's columns): acc[i][b] += tile i's products * 2^-14 (fp16
// codes times their block scale, exact; one fp16 product). A staged fragment read from shared
// memory serves all FT tiles: at 64 rows, one 16-row tile per warp read 16 activation bytes from
// shared memory per weight byte.
template <int NB, int FT>
__device__ __forceinline__ void tile_step_staged(float (&acc)[FT][NB][4], const uint4 (&w)[FT][2],
                                                 const uint32_t (&sc)[FT][2], const unsigned char* stage, int g,
                                                 int t) {
  __half2 scale[FT][2][2];
  tile_scales_f16<FT>(sc, scale);
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) {
    uint32_t P[FT][2][4];
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) word_codes_f16((&w[i][h].x)[wd], scale[i][h][wd >> 1], P[i][h]);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      // Inputs 32 t + 8 wd .. + 7 of staged row 8 b + g, paired (i, i + 4) as the codes are.
      const uint4 r = *reinterpret_cast<const uint4*>(stage + staged_slot_offset(8 * b + g, wd * 4 + t));
      const uint32_t b0 = prmt(r.x, r.z, 0x5410), b1 = prmt(r.x, r.z, 0x7632);
      const uint32_t b2 = prmt(r.y, r.w, 0x5410), b3 = prmt(r.y, r.w, 0x7632);
#pragma unroll
      for (int i = 0; i < FT; ++i) {
        mma_f16(acc[i][b], P[i][0][0], P[i][1][0], P[i][0][1], P[i][1][1], b0, b1);
        mma_f16(acc[i][b], P[i][0][2], P[i][1][2], P[i][0][3], P[i][1][3], b2, b3);
      }
    }
  }
}

// The power of two s with m / s in [2^14, 2^15) (1 for 0 or non-finite m): a fast operand's scale.
__device__ __forceinline__ float operand_scale(float m) {
  if (!(m > 0.f) || !isfinite(m)) return 1.f;
  int e = 0;
  frexpf(m, &e);
  return ldexpf(1.f, e - 15);
}

// A lane's share of FT 16-row tiles of an NVFP4 weight (its 16 code bytes of each of its two rows
// per tile and step, as tile_step takes them), streamed through a ring of D steps in shared
// memory: the copies of a step are issued D steps before the warp multiplies it, and the weights
// never change, so a kernel may issue its first steps before pdl_wait(). Each lane copies and reads
// only its own slots, so cp.async.wait_group orders them without a barrier. A lane's two block
// scales of a row and step are a 2-byte pair inside an aligned 4-byte word (the rows' scale
// arrays start at even offsets: k / 16 is even); the lane copies that word and shifts.
template <int FT, int D>
struct WeightStream {
  static constexpr int kSlots = D * FT * 2;              // (step, tile, half) per lane
  static constexpr int kWarpBytes = kSlots * 32 * (16 + 4);
  const uint8_t* codes[FT][2];
  const uint8_t* scales[FT][2];
  uint32_t shift[FT][2];
  uint4* ring_codes;  // this lane's slot 0; slot i at ring_codes[32 * i]
  uint32_t* ring_scales;
  int k, t;

  __device__ __forceinline__ void init(unsigned char* warp_ring, int lane, int k_) {
    ring_codes = reinterpret_cast<uint4*>(warp_ring) + lane;
    ring_scales = reinterpret_cast<uint32_t*>(warp_ring + kSlots * 32 * 16) + lane;
    k = k_;
    t = lane & 3;
  }

  // Tile i, half h: the row's codes (k / 2 bytes) and block scales (k / 16 bytes).
  __device__ __forceinline__ void set_row(int i, int h, const uint8_t* code_row, const uint8_t* scale_row) {
    codes[i][h] = code_row + 16 * t;
    scales[i][h] = scale_row;
    shift[i][h] = (uint32_t)((reinterpret_cast<uintptr_t>(scale_row) + 2 * t) & 2u) * 8u;
  }

  // Step s's copies into ring step `slot`; a lane past k gets zeros (codes and scales).
  __device__ __forceinline__ void issue(int s, int slot) const {
    const int in0 = s * kStepInputs + 32 * t;
    const bool ok = in0 < k;
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int idx = (slot * FT + i) * 2 + h;
        cp_async_16(ring_codes + 32 * idx, ok ? codes[i][h] + s * (kStepInputs / 2) : codes[i][h], ok ? 16 : 0);
        const uintptr_t word = (reinterpret_cast<uintptr_t>(scales[i][h]) + (ok ? in0 / 16 : 0)) & ~uintptr_t(3);
        cp_async_4(ring_scales + 32 * idx, reinterpret_cast<const void*>(word), ok ? 4 : 0);
      }
  }

  // The landed step in ring step `slot` (after the caller's cp_async_wait).
  __device__ __forceinline__ void fetch(int slot, uint4 (&w)[FT][2], uint32_t (&sc)[FT][2]) const {
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int idx = (slot * FT + i) * 2 + h;
        w[i][h] = ring_codes[32 * idx];
        sc[i][h] = ring_scales[32 * idx] >> shift[i][h];
      }
  }
};

// A block's many-row product over steps s0 .. s0 + nsteps - 1 with D - 1 steps in flight: per step
// every thread stages its share of the activations (stage(s, slot): cp.async into ring slot `slot`
// of act, act_stage_bytes apart) and each warp its FT tiles' codes (ws). Groups: the caller has
// committed the weights of steps 0 .. D - 2 (one group each, before pdl_wait: they never change)
// and then their activations; each iteration commits one group (both) for the step D - 1 ahead, so
// step j is complete once at most D - 2 newer groups are in flight. Every thread of the block calls it.
template <int NB, int FT, int D, typename Stage>
__device__ __forceinline__ void staged_steps(const WeightStream<FT, D>& ws, Stage&& stage, int s0, int nsteps,
                                             const unsigned char* act, int act_stage_bytes, int g, int t,
                                             float (&acc)[FT][NB][4]) {
  for (int j = 0; j < nsteps; ++j) {
    cp_async_wait<D - 2>();
    __syncthreads();  // step j staged by every thread; step j - 1's slot read by every warp
    const int ahead = j + D - 1;
    if (ahead < nsteps) {
      ws.issue(s0 + ahead, ahead % D);
      stage(s0 + ahead, ahead % D);
    }
    cp_async_commit();
    uint4 w[FT][2];
    uint32_t sc[FT][2];
    ws.fetch(j % D, w, sc);
    tile_step_staged<NB, FT>(acc, w, sc, act + (j % D) * act_stage_bytes, g, t);
  }
}

}  // namespace nvfp4_mma
}  // namespace hearth
