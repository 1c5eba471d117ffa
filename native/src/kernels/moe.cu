// The mixture-of-experts feed-forward block's kernels (engine/moe.py is the reference math):
//   router   logits [T, stride] = xn @ router^T in fp32, one warp per logit (the router's E rows,
//            then the shared expert's sigmoid gate row where the model has one);
//   top_k    per row: softmax over the E logits in fp32, the k largest (ties: the lower expert),
//            renormalised when asked -> T * k (row, expert, weight) pairs, pair p = t * k + j;
//   few rows (decode): expert GEMVs that read only the selected experts' rows (NVFP4 experts on
//            tensor cores, moe_expert_mma_kernel; bf16 ones, and NVFP4 of sizes not a multiple of
//            32, a warp per output):
//            gate/up   act[p, i] = silu(x[t] . gate_e[i]) * (x[t] . up_e[i])
//            down      y[p, n]   = act[p] . down_e[n]
//   many rows (prefill, large batches): the pairs sorted by expert into tiles of kMoeTileRows
//            (kMoeGemvTileRows up to kMoeTiledMaxRows tokens; sort, one block, on the device:
//            nothing goes back to the host, so decode graphs capture it), then a tensor-core grouped
//            product per (tile, outputs) (NVFP4 at the fast precision: moe_grouped_nvfp4_kernel,
//            codes read in place; else the WMMA GEMM below, 64 outputs a block): the fast
//            precision one product over fp16 operands (activations clamped to fp16's range;
//            bf16 and e2m1 * e4m3 weights are exact in fp16 down to its subnormals), the exact
//            precision two over bf16 operands (the activation as bf16 hi + lo); tiles past the
//            sort's count exit at once, so an expert no token chose costs no read;
//   combine  resid[t] += sum_j w[t, j] * y[t * k + j] (+ sigmoid(gate logit) * shared y[t]), in a
//            fixed order, and the row's sum of squares for the next layer's fused GEMV norm.
// Expert weights are bf16 (both precisions) or NVFP4 (codes and e4m3 block scales read directly;
// e2m1 * e4m3 is exact in bf16); each expert's NVFP4 global scale multiplies its finished sums.
// Each output's sum runs in the same order whatever the batch, so a row's result does not depend
// on the other rows of its path.
#include <mma.h>

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "../common.cuh"
#include "../launch.cuh"
#include "kernels.h"
#include "nvfp4.cuh"
#include "nvfp4_mma.cuh"

namespace hearth {

namespace {

constexpr int kWarpThreads = 256;

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }

__device__ __forceinline__ float expert_scale(const float* per_expert, float fallback, int e) {
  return per_expert ? per_expert[e] : fallback;
}

// dot(x[0:k], row `row` of w) over one warp (lanes stride the row; the sum in lane order, then a
// butterfly): bf16 rows of k, or NVFP4 rows of k / 2 code bytes and k / 16 block scales.
template <bool NVFP4>
__device__ __forceinline__ float warp_row_dot(const float* __restrict__ x, const void* w,
                                              const uint8_t* block_scales, size_t row, int k,
                                              int lane) {
  float acc = 0.f;
  if constexpr (!NVFP4) {
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const bf16*>(w) + row * k);
    const float4* xr = reinterpret_cast<const float4*>(x);
    for (int c = lane; c < k / 8; c += 32) {
      const uint4 raw = __ldg(wr + c);
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
      const float4 a = __ldg(xr + 2 * c), b = __ldg(xr + 2 * c + 1);
      const float2 w0 = __bfloat1622float2(pairs[0]), w1 = __bfloat1622float2(pairs[1]);
      const float2 w2 = __bfloat1622float2(pairs[2]), w3 = __bfloat1622float2(pairs[3]);
      acc += w0.x * a.x + w0.y * a.y + w1.x * a.z + w1.y * a.w + w2.x * b.x + w2.y * b.y +
             w3.x * b.z + w3.y * b.w;
    }
  } else {
    const uint2* wr = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w) + row * (k / 2));
    const uint8_t* sr = block_scales + row * (k / 16);
    for (int c = lane; c < k / 16; c += 32) {  // one 16-input block per step
      const uint2 raw = __ldg(wr + c);
      const float4* xc = reinterpret_cast<const float4*>(x + 16 * c);
      float part = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // 4 inputs (2 code bytes) per float4
        const uint32_t word = q < 2 ? raw.x : raw.y;
        const float2 lo = e2m1_pair_scaled((word >> (16 * (q & 1))) & 0xFFu);
        const float2 hi = e2m1_pair_scaled((word >> (16 * (q & 1) + 8)) & 0xFFu);
        const float4 a = __ldg(xc + q);
        part += lo.x * a.x + lo.y * a.y + hi.x * a.z + hi.y * a.w;
      }
      acc += part * (e4m3_value(__ldg(sr + c)) * kE2m1Unscale);
    }
  }
  return warp_sum(acc);
}

template <typename F>
auto dispatch_format(bool nvfp4, F f) {
  return nvfp4 ? f(std::true_type{}) : f(std::false_type{});
}

__global__ void moe_router_kernel(const float* __restrict__ x, const bf16* __restrict__ w,
                                  float* __restrict__ logits, int rows, int n, int k) {
  pdl_wait();
  pdl_launch_dependents();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= rows * n) return;
  const int t = warp / n, e = warp % n;
  const float v = warp_row_dot<false>(x + (size_t)t * k, w, nullptr, e, k, lane);
  if (lane == 0) logits[(size_t)t * n + e] = v;
}

// (value, expert) ordered by value descending, then expert ascending: torch.topk's order for
// distinct values, the lower expert first on ties.
__device__ __forceinline__ bool ranks_before(float v, int e, float ov, int oe) {
  return v > ov || (v == ov && e < oe);
}

// A float's bits as an unsigned integer in the float's order (-0 taken as +0 first), so that one
// __reduce_max_sync finds a warp's largest value.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v + 0.f);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7FFFFFFFu : ~key);
}

// Logits a lane keeps in registers for its picks: routers of up to 256 experts.
constexpr int kTopKPerLane = 8;

// Calls f(value, expert) for each of this lane's logits (experts lane, lane + 32, ...): the first
// kTopKPerLane from registers, any further ones read again through L2 (a router wider than 256).
template <typename F>
__device__ __forceinline__ void for_lane_logits(const float (&v)[kTopKPerLane], const float* l, int experts, int lane,
                                                F&& f) {
#pragma unroll
  for (int j = 0; j < kTopKPerLane; ++j)
    if (lane + 32 * j < experts) f(v[j], lane + 32 * j);
  for (int e = lane + 32 * kTopKPerLane; e < experts; e += 32) f(__ldcg(l + e), e);
}

// Softmax over row l's first `experts` logits in fp32 and its top_k picks, by one warp (every lane
// calls it); lane j < top_k writes pick j. Logits are read once, through L2 (__ldcg: the fused
// route kernel reads what other blocks just wrote), into registers; each pick is the best (value,
// expert) ranked after the one before (no set of taken experts), a lane's best among its own
// logits, then the warp's by two reductions (the largest value, then the lowest expert holding it).
// The first version re-read the logits from L2 and shuffled five times per pick: ~7 us a row.
// More experts than 32 x kTopKPerLane (no model we run) re-read the rest per pick.
__device__ __forceinline__ void top_k_row(const float* l, int experts, int top_k, int normalize, int lane,
                                          int32_t* pair_expert, float* pair_weight) {
  float v[kTopKPerLane];
#pragma unroll
  for (int j = 0; j < kTopKPerLane; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < experts ? __ldcg(l + e) : -INFINITY;
  }
  float m = -INFINITY;
  for_lane_logits(v, l, experts, lane, [&](float x, int) { m = fmaxf(m, x); });
  m = warp_max(m);
  float s = 0.f;
  for_lane_logits(v, l, experts, lane, [&](float x, int) { s += expf(x - m); });
  s = warp_sum(s);
  float prev_v = INFINITY, total = 0.f;
  int prev_e = -1;
  float my_weight = 0.f;
  int my_expert = 0;
  for (int pick = 0; pick < top_k; ++pick) {
    float bv = -INFINITY;
    int be = INT_MAX;
    for_lane_logits(v, l, experts, lane, [&](float x, int e) {
      if (ranks_before(prev_v, prev_e, x, e) && ranks_before(x, e, bv, be)) bv = x, be = e;
    });
    // NaN never ranks before anything: a lane's best is a number or (-inf, none).
    const unsigned best = __reduce_max_sync(0xffffffffu, order_key(bv));
    be = (int)__reduce_min_sync(0xffffffffu, order_key(bv) == best ? (unsigned)be : (unsigned)INT_MAX);
    bv = key_value(best);
    if (be == INT_MAX) be = 0;  // NaN logits: route somewhere valid rather than read out of bounds
    const float p = expf(bv - m) / s;
    total += p;
    if (lane == pick) my_weight = p, my_expert = be;
    prev_v = bv, prev_e = be;
  }
  if (lane < top_k) {
    pair_expert[lane] = my_expert;
    pair_weight[lane] = normalize ? my_weight / total : my_weight;
  }
}

__global__ void moe_top_k_kernel(const float* __restrict__ logits, int rows, int stride,
                                 int experts, int top_k, int normalize,
                                 int32_t* __restrict__ pair_expert, float* __restrict__ pair_weight) {
  pdl_wait();
  pdl_launch_dependents();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= rows) return;
  top_k_row(logits + (size_t)warp * stride, experts, top_k, normalize, lane, pair_expert + (size_t)warp * top_k,
            pair_weight + (size_t)warp * top_k);
}

// Decode rows whose residual stream already holds the attention block's output and leaves its sums
// of squares in norm partials (the fused GEMV path): RMSNorm, router logits, softmax and top-k in
// one kernel. Block (b, t): 8 warps, router rows 8b .. 8b + 7 of row t (1 / rms from the partials,
// the norm weight applied on the fly); the blocks also write the normalized row for the experts; the
// row's last block to finish (a counter, left zero) picks its experts. The router's and the norm's
// weights never change: a lane loads its first kRouteChunks chunks of both before pdl_wait(), while
// the kernel before still runs (all of them for hidden <= 2048).
constexpr int kRouteWarps = 8;
constexpr int kRouteChunks = 8;  // 8 bf16 each, per lane

__device__ __forceinline__ float route_dot8(const uint4& wr, const uint4& nr, const float4* xr, int c) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wr);
  const __nv_bfloat162* np = reinterpret_cast<const __nv_bfloat162*>(&nr);
  const float4 a = xr[2 * c], b = xr[2 * c + 1];
  const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float acc = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 wf = __bfloat1622float2(wp[q]), nf = __bfloat1622float2(np[q]);
    acc += xs[2 * q] * nf.x * wf.x + xs[2 * q + 1] * nf.y * wf.y;
  }
  return acc;
}

__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRoute r) {
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = r.hidden, chunks = H / 8;
  const int e = blockIdx.x * kRouteWarps + warp;
  const uint4* w = reinterpret_cast<const uint4*>(r.router + (size_t)min(e, r.router_rows - 1) * H);
  const uint4* nw = reinterpret_cast<const uint4*>(r.norm_weight);
  uint4 wr[kRouteChunks], nr[kRouteChunks];
#pragma unroll
  for (int j = 0; j < kRouteChunks; ++j) {
    const int c = lane + 32 * j;
    if (c < chunks) wr[j] = __ldg(w + c), nr[j] = __ldg(nw + c);
    else wr[j] = nr[j] = make_uint4(0u, 0u, 0u, 0u);
  }
  pdl_wait();
  pdl_launch_dependents();
  const float* x = r.resid + (size_t)t * H;
  const float* parts = r.norm_partials + (size_t)t * r.norm_count;
  // Warp 0's first norm partials and every warp's activations are requested together (one L2
  // round trip, not two); 1 / rms multiplies the finished dot.
  float p0 = 0.f, p1 = 0.f;
  if (warp == 0) {
    if (lane < r.norm_count) p0 = parts[lane];
    if (lane + 32 < r.norm_count) p1 = parts[lane + 32];
  }
  float acc = 0.f;  // chunks in the order lane, lane + 32, ...: the sums of the first version
  if (e < r.router_rows) {
    const float4* xr = reinterpret_cast<const float4*>(x);
#pragma unroll
    for (int j = 0; j < kRouteChunks; ++j)
      if (lane + 32 * j < chunks) acc += route_dot8(wr[j], nr[j], xr, lane + 32 * j);
    for (int c = lane + 32 * kRouteChunks; c < chunks; c += 32) acc += route_dot8(__ldg(w + c), __ldg(nw + c), xr, c);
    acc = warp_sum(acc);
  }
  __shared__ float inv_rms;
  __shared__ int last;
  if (warp == 0) {
    float sq = p0 + p1;
    for (int i = lane + 64; i < r.norm_count; i += 32) sq += parts[i];
    sq = warp_sum(sq);
    if (lane == 0) inv_rms = rsqrtf(sq / (float)H + r.eps);
  }
  __syncthreads();
  const float inv = inv_rms;
  if (e < r.router_rows && lane == 0) r.logits[(size_t)t * r.stride + e] = acc * inv;
  // The blocks also write the normalized row for the experts, each its share.
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
    r.xn[(size_t)t * H + i] = x[i] * inv * __bfloat162float(r.norm_weight[i]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&r.counters[t], 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp == 0)
    top_k_row(r.logits + (size_t)t * r.stride, r.experts, r.top_k, r.normalize, lane,
              r.pair_expert + (size_t)t * r.top_k, r.pair_weight + (size_t)t * r.top_k);
  if (threadIdx.x == 0) r.counters[t] = 0;
}

template <bool NVFP4>
__global__ void moe_gate_up_gemv_kernel(const float* __restrict__ x, MoeExperts ex,
                                        const int32_t* __restrict__ pair_expert, int pairs,
                                        int top_k, float* __restrict__ act) {
  pdl_wait();
  pdl_launch_dependents();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int I = ex.inter, H = ex.hidden;
  if (warp >= pairs * I) return;
  const int p = warp / I, i = warp % I;
  const int e = pair_expert ? pair_expert[p] : 0;
  const float* xr = x + (size_t)(p / top_k) * H;
  const size_t base = (size_t)e * 2 * I;
  const float scale = expert_scale(ex.gate_up_scales, ex.gate_up.scale, e);
  const float g = warp_row_dot<NVFP4>(xr, ex.gate_up.data, ex.gate_up.block_scales, base + i, H, lane);
  const float u = warp_row_dot<NVFP4>(xr, ex.gate_up.data, ex.gate_up.block_scales, base + I + i, H, lane);
  if (lane == 0) act[(size_t)p * I + i] = silu_mul(g * scale, u * scale);
}

template <bool NVFP4>
__global__ void moe_down_gemv_kernel(const float* __restrict__ act, MoeExperts ex,
                                     const int32_t* __restrict__ pair_expert, int pairs,
                                     float* __restrict__ y) {
  pdl_wait();
  pdl_launch_dependents();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int I = ex.inter, H = ex.hidden;
  if (warp >= pairs * H) return;
  const int p = warp / H, n = warp % H;
  const int e = pair_expert ? pair_expert[p] : 0;
  const float v = warp_row_dot<NVFP4>(act + (size_t)p * I, ex.down.data, ex.down.block_scales,
                                      (size_t)e * H + n, I, lane);
  if (lane == 0) y[(size_t)p * H + n] = v * expert_scale(ex.down_scales, ex.down.scale, e);
}

// NVFP4 experts whose input size is a multiple of 32 (every real shape): the expert GEMV on tensor
// cores, as gemv_nvfp4.cu does for dense projections (nvfp4_mma.cuh): block (tile, column set) = 16
// weight rows of one expert, its 4 warps splitting k in 128-input steps, the codes streamed through
// each warp's cp.async ring. The mma's batch columns are the block's rows of activations: one pair
// (PER_PAIR, decode: blockIdx.y = pair p, expert pair_expert[p]) or a sorted tile of up to 8 pairs of
// one expert (9-64 rows at the exact precision: moe_sort with 8-row tiles; an expert is read once per
// 8 of its rows; the fast precision takes moe_grouped_nvfp4_kernel's 8-row tiles there).
// gate_up: the tile's rows 0-7 are gate rows j, rows 8-15 the matching up rows, so a lane holds
// both sums of an output; down: 16 consecutive output rows. Sums added in warp order: a pair's
// result does not depend on the other pairs of its block, and both paths take the same warps.
// Eight blocks of 4 warps an SM (64 registers, a few bytes spilled), where it was four of 8: the
// blocks are small (gate_up 16 rows x 2,048 inputs, down 16 x 768) and a batch-1 layer's 768 gate_up
// and 1,024 down blocks now fit one wave of 1,056 on the H100, not 1.45 and 1.94 of 528; each wave
// paid the whole chain (gate_up cannot request a weight before the route is known). Measured on
// Qwen3-30B-A3B NVFP4 (H100, docs/BENCHMARKS.md): batch-1 step 2,960 / 2,965 -> 2,862 us, the expert
// kernels 1,017 -> 934 us a step; batch 8 9,404 -> 9,069 us (with gate_up's ring 4 deep, which lost
// at batch 1: 3,017 / 3,020 us). Before: four blocks of 8 an SM against three (73-76 registers), batch
// 64's expert kernels 18.3 -> 17.2 ms a step.
constexpr int kMmaWarps = 4;
constexpr int kMmaDepth = 2;  // steps in flight per warp (gate_up's k = 2048 is 4 steps a warp)
using ExpertStream = nvfp4_mma::WeightStream<1, kMmaDepth>;
constexpr int kMmaRingBytes = kMmaWarps * ExpertStream::kWarpBytes;

template <bool GATE_UP, bool PER_PAIR>
__global__ void __launch_bounds__(kMmaWarps * 32, 8)
    moe_expert_mma_kernel(const float* __restrict__ x, MoeExperts ex, const int32_t* __restrict__ pair_expert,
                          const int32_t* __restrict__ sorted, const int32_t* __restrict__ tiles, int top_k,
                          float* __restrict__ out) {
  using namespace nvfp4_mma;
  __shared__ __align__(16) unsigned char ring[kMmaRingBytes];
  const int tile = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  // gate_up waits for the route (or sort) before reading which expert it multiplies. down runs right
  // after gate_up, which launched it only once past its own wait: the routing is complete, so down
  // reads it (through L2: the buffers are rewritten every layer) and requests its first weight steps
  // before waiting for gate_up's activations.
  if constexpr (GATE_UP) {
    pdl_wait();
    pdl_launch_dependents();
  }
  // Columns: sorted positions first .. first + cols - 1 (per pair: the pair itself, identity order).
  int e, first, cols;
  if constexpr (PER_PAIR) {
    first = blockIdx.y, cols = 1;
    e = pair_expert ? __ldcg(pair_expert + first) : 0;
  } else {
    const int tl = blockIdx.y;
    if (tl >= __ldcg(tiles)) return;  // past the sort's count: nothing routed here
    e = __ldcg(tiles + 1 + 3 * tl), first = __ldcg(tiles + 2 + 3 * tl), cols = __ldcg(tiles + 3 + 3 * tl);
  }
  auto pair_at = [&](int pos) { return PER_PAIR ? pos : sorted[pos]; };
  const int I = ex.inter, H = ex.hidden;
  const int k = GATE_UP ? H : I;
  const WeightView& w = GATE_UP ? ex.gate_up : ex.down;
  const size_t expert_rows = GATE_UP ? 2 * (size_t)I : (size_t)H;

  ExpertStream ws;
  ws.init(ring + warp * ExpertStream::kWarpBytes, lane, k);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t row = (size_t)e * expert_rows +
                       (GATE_UP ? (size_t)min(tile * 8 + g, I - 1) + h * (size_t)I : (size_t)min(tile * 16 + g + 8 * h, H - 1));
    ws.set_row(0, h, static_cast<const uint8_t*>(w.data) + row * (k / 2), w.block_scales + row * (k / 16));
  }
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int my_steps = warp < steps ? (steps - 1 - warp) / kMmaWarps + 1 : 0;
#pragma unroll
  for (int d = 0; d < kMmaDepth; ++d) {
    if (d < my_steps) ws.issue(warp + d * kMmaWarps, d);
    cp_async_commit();
  }
  if constexpr (!GATE_UP) {
    pdl_wait();
    pdl_launch_dependents();
  }
  // Column g's activations: gate_up reads the pair's token row, down the pair's act row (by position).
  const bool has_x = g < cols;
  const int pos = first + min(g, cols - 1);
  const float* xr = x + (size_t)(GATE_UP ? pair_at(pos) / top_k : pos) * k;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  for (int j = 0; j < my_steps; ++j) {
    const int s = warp + j * kMmaWarps;
    const int in0 = s * kStepInputs + 32 * t;
    const bool ok = in0 < k;
    float4 xv[8];
#pragma unroll
    for (int q = 0; q < 8; ++q)
      xv[q] = ok && has_x ? __ldg(reinterpret_cast<const float4*>(xr + in0) + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    cp_async_wait<kMmaDepth - 1>();
    uint4 wv[1][2];
    uint32_t sc[1][2];
    ws.fetch(j % kMmaDepth, wv, sc);
    tile_step<1>(acc, wv, sc, xv);
    if (j + kMmaDepth < my_steps) ws.issue(s + kMmaDepth * kMmaWarps, j % kMmaDepth);
    cp_async_commit();
  }
  // acc = (tile row g, columns 2t, 2t + 1), (tile row g + 8, columns 2t, 2t + 1).
  __shared__ float part[kMmaWarps][16][8];
  part[warp][g][2 * t] = acc[0][0];
  part[warp][g][2 * t + 1] = acc[0][1];
  part[warp][g + 8][2 * t] = acc[0][2];
  part[warp][g + 8][2 * t + 1] = acc[0][3];
  __syncthreads();
  const float scale = (GATE_UP ? expert_scale(ex.gate_up_scales, ex.gate_up.scale, e)
                               : expert_scale(ex.down_scales, ex.down.scale, e)) * 128.f;
  auto total = [&](int r, int c) {
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kMmaWarps; ++q) v += part[q][r][c];
    return v * scale;
  };
  if constexpr (GATE_UP) {  // act by sorted position (per pair: by pair)
    for (int q = threadIdx.x; q < 8 * cols; q += blockDim.x) {
      const int c = q >> 3, jj = q & 7, j = tile * 8 + jj;
      if (j < I) out[(size_t)(first + c) * I + j] = silu_mul(total(jj, c), total(jj + 8, c));
    }
  } else {  // y by pair
    for (int q = threadIdx.x; q < 16 * cols; q += blockDim.x) {
      const int c = q >> 4, f = q & 15, nn = tile * 16 + f;
      if (nn < H) out[(size_t)pair_at(first + c) * H + nn] = total(f, c);
    }
  }
}

// tiles[0] = the tile count, then (expert, first sorted position, rows) per tile, by expert. Thread i
// owns experts kSortExpertsPerThread * i ..: their first positions and first tiles come from two
// block-wide prefix sums (CUB), so every thread writes its experts' tiles at once. Thread 0 walked
// the experts alone before: 12.6 us a layer at batch 64 on Qwen3-30B-A3B (128 experts, H100).
constexpr int kSortThreads = 1024;
constexpr int kSortExpertsPerThread = 4;  // up to 4096 experts

__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(const int32_t* __restrict__ pair_expert, int pairs,
                                                                int experts, int tile_rows,
                                                                int32_t* __restrict__ sorted,
                                                                int32_t* __restrict__ tiles) {
  pdl_wait();
  pdl_launch_dependents();
  using Scan = cub::BlockScan<int, kSortThreads>;
  __shared__ typename Scan::TempStorage scan;
  extern __shared__ int shared_counts[];
  int* counts = shared_counts;
  int* cursor = shared_counts + experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&counts[pair_expert ? pair_expert[p] : 0], 1);
  __syncthreads();
  int count[kSortExpertsPerThread], tile_count[kSortExpertsPerThread];
  int first[kSortExpertsPerThread], first_tile[kSortExpertsPerThread];
#pragma unroll
  for (int j = 0; j < kSortExpertsPerThread; ++j) {
    const int e = threadIdx.x * kSortExpertsPerThread + j;
    count[j] = e < experts ? counts[e] : 0;
    tile_count[j] = (count[j] + tile_rows - 1) / tile_rows;
  }
  Scan(scan).ExclusiveSum(count, first);
  __syncthreads();  // the scan's storage is used again
  int total_tiles = 0;
  Scan(scan).ExclusiveSum(tile_count, first_tile, total_tiles);
#pragma unroll
  for (int j = 0; j < kSortExpertsPerThread; ++j) {
    const int e = threadIdx.x * kSortExpertsPerThread + j;
    if (e >= experts) break;
    cursor[e] = first[j];
    for (int r = 0, t = first_tile[j]; r < count[j]; r += tile_rows, ++t) {
      tiles[1 + 3 * t] = e;
      tiles[2 + 3 * t] = first[j] + r;
      tiles[3 + 3 * t] = min(tile_rows, count[j] - r);
    }
  }
  if (threadIdx.x == 0) tiles[0] = total_tiles;
  __syncthreads();
  // Positions within an expert follow the atomics' order; a row's products do not depend on it.
  for (int p = threadIdx.x; p < pairs; p += blockDim.x)
    sorted[atomicAdd(&cursor[pair_expert ? pair_expert[p] : 0], 1)] = p;
}

// ---- the grouped GEMM: a block computes kMoeTileRows sorted rows x 64 outputs of one expert.
constexpr int kTileN = 64, kTileK = 32, kLd = kTileK + 8;  // +8: no bank conflicts on fragments
constexpr int kGroupedThreads = 128;                        // 4 warps, 32 x 32 outputs each
constexpr int kCLd = kTileN + 4;
static_assert(kMoeTileRows == 64, "the grouped GEMM's warp layout assumes 64-row tiles");

struct GroupedArgs {
  const float* x;  // gate/up: the normalized rows, gathered by pair; down: act in sorted order
  MoeExperts ex;
  const int32_t* sorted;
  const int32_t* tiles;
  int top_k;
  float* out;  // gate/up: act [pairs, inter] in sorted order; down: y [pairs, hidden] by pair
};

// Shared memory: the operand tiles during the K loop, then the fp32 results (a union).
template <bool SPLIT, bool GATE_UP>
struct GroupedSmem {
  static constexpr int kOperands = (SPLIT ? 2 : 1) + (GATE_UP ? 2 : 1);
  static constexpr int kOperandBytes = kOperands * kMoeTileRows * kLd * 2;
  static constexpr int kResultBytes = (GATE_UP ? 2 : 1) * kMoeTileRows * kCLd * 4;
  static constexpr int kBytes = kOperandBytes > kResultBytes ? kOperandBytes : kResultBytes;
};

template <typename T>
__device__ __forceinline__ T to_operand(float v) {
  if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16(v);
  else return __float2half_rn(v);
}

// Rows [n0, n0 + 64) of a weight (bf16 rows of k, or NVFP4), inputs [k0, k0 + 32), as T (bf16 or
// fp16) into dst [64][kLd]; rows past n_end and inputs past k are zero.
template <bool NVFP4, typename T>
__device__ __forceinline__ void load_weight_tile(const WeightView& w, size_t row0, int rows_valid,
                                                 int k, int k0, T* dst) {
  if constexpr (!NVFP4) {
    for (int q = threadIdx.x; q < kTileN * (kTileK / 8); q += kGroupedThreads) {
      const int r = q / (kTileK / 8), c = (q % (kTileK / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows_valid && k0 + c < k)
        v = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(w.data) + (row0 + r) * k + k0 + c));
      if constexpr (std::is_same_v<T, bf16>) {
        *reinterpret_cast<uint4*>(dst + r * kLd + c) = v;
      } else {
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
        __half2 h[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = __float22half2_rn(__bfloat1622float2(pairs[e]));
        *reinterpret_cast<uint4*>(dst + r * kLd + c) = *reinterpret_cast<const uint4*>(h);
      }
    }
  } else {
    for (int q = threadIdx.x; q < kTileN * (kTileK / 16); q += kGroupedThreads) {
      const int r = q / (kTileK / 16), c = (q % (kTileK / 16)) * 16;
      T* d = dst + r * kLd + c;
      if (r < rows_valid && k0 + c < k) {
        const size_t row = row0 + r;
        const uint2 raw = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) +
                                                               row * (k / 2) + (k0 + c) / 2));
        const float s = e4m3_value(__ldg(w.block_scales + row * (k / 16) + (k0 + c) / 16)) * kE2m1Unscale;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          const uint32_t byte = ((b < 4 ? raw.x : raw.y) >> (8 * (b & 3))) & 0xFFu;
          const float2 v = e2m1_pair_scaled(byte);
          d[2 * b] = to_operand<T>(v.x * s);  // exact: e2m1 * e4m3 has at most 6 significant bits
          d[2 * b + 1] = to_operand<T>(v.y * s);
        }
      } else {
#pragma unroll
        for (int b = 0; b < 16; ++b) d[b] = to_operand<T>(0.f);
      }
    }
  }
}

template <bool NVFP4, bool SPLIT, bool GATE_UP>
__global__ void __launch_bounds__(kGroupedThreads) moe_grouped_kernel(GroupedArgs a) {
  pdl_wait();
  pdl_launch_dependents();
  using namespace nvcuda;
  using Smem = GroupedSmem<SPLIT, GATE_UP>;
  using T = std::conditional_t<SPLIT, bf16, __half>;  // the operands: exact (split) or fast
  __shared__ __align__(128) unsigned char smem[Smem::kBytes];
  const int tile = blockIdx.y;
  if (tile >= a.tiles[0]) return;
  const int e = a.tiles[1 + 3 * tile], start = a.tiles[2 + 3 * tile], rows = a.tiles[3 + 3 * tile];
  const int I = a.ex.inter, H = a.ex.hidden;
  const int N = GATE_UP ? I : H, K = GATE_UP ? H : I;
  const int n0 = blockIdx.x * kTileN;
  const int n_valid = min(kTileN, N - n0);
  const WeightView& w = GATE_UP ? a.ex.gate_up : a.ex.down;
  const size_t first_row = GATE_UP ? (size_t)e * 2 * I + n0 : (size_t)e * H + n0;

  T* a_hi = reinterpret_cast<T*>(smem);
  T* a_lo = a_hi + (SPLIT ? kMoeTileRows * kLd : 0);
  T* b_tile = a_hi + (SPLIT ? 2 : 1) * kMoeTileRows * kLd;  // [gate; up] for GATE_UP
  const int warp = threadIdx.x >> 5;
  const int wr = (warp >> 1) * 32, wc = (warp & 1) * 32;
  constexpr int kParts = GATE_UP ? 2 : 1;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kParts][2][2];
#pragma unroll
  for (int q = 0; q < kParts; ++q)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[q][i][j], 0.f);

  for (int k0 = 0; k0 < K; k0 += kTileK) {
    __syncthreads();  // the previous step's fragments are loaded
    for (int q = threadIdx.x; q < kMoeTileRows * (kTileK / 4); q += kGroupedThreads) {
      const int r = q / (kTileK / 4), c = (q % (kTileK / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < rows && k0 + c < K) {
        const int pos = start + r;
        const size_t src = GATE_UP ? (size_t)(a.sorted[pos] / a.top_k) : (size_t)pos;
        v = *reinterpret_cast<const float4*>(a.x + src * K + k0 + c);
      }
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (SPLIT) {
          const bf16 hi = __float2bfloat16(f[i]);
          a_hi[r * kLd + c + i] = hi;
          a_lo[r * kLd + c + i] = __float2bfloat16(f[i] - __bfloat162float(hi));
        } else {
          a_hi[r * kLd + c + i] = __float2half_rn(fminf(fmaxf(f[i], -65504.f), 65504.f));
        }
      }
    }
    load_weight_tile<NVFP4, T>(w, first_row, n_valid, K, k0, b_tile);
    if constexpr (GATE_UP) load_weight_tile<NVFP4, T>(w, first_row + I, n_valid, K, k0, b_tile + kTileN * kLd);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2], fl[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(fa[i], a_hi + (wr + 16 * i) * kLd + kk, kLd);
        if constexpr (SPLIT) wmma::load_matrix_sync(fl[i], a_lo + (wr + 16 * i) * kLd + kk, kLd);
      }
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, b_tile + q * kTileN * kLd + (wc + 16 * j) * kLd + kk, kLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            wmma::mma_sync(acc[q][i][j], fa[i], fb, acc[q][i][j]);
            if constexpr (SPLIT) wmma::mma_sync(acc[q][i][j], fl[i], fb, acc[q][i][j]);
          }
        }
      }
    }
  }
  __syncthreads();  // operand tiles are done: the results take their place
  float* c = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int q = 0; q < kParts; ++q)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(c + q * kMoeTileRows * kCLd + (wr + 16 * i) * kCLd + wc + 16 * j,
                                acc[q][i][j], kCLd, wmma::mem_row_major);
  __syncthreads();
  const float scale = GATE_UP ? expert_scale(a.ex.gate_up_scales, a.ex.gate_up.scale, e)
                              : expert_scale(a.ex.down_scales, a.ex.down.scale, e);
  for (int q = threadIdx.x; q < kMoeTileRows * kTileN; q += kGroupedThreads) {
    const int r = q / kTileN, col = q % kTileN;
    if (r >= rows || col >= n_valid) continue;
    const int pos = start + r;
    if constexpr (GATE_UP) {
      const float g = c[r * kCLd + col] * scale, u = c[kMoeTileRows * kCLd + r * kCLd + col] * scale;
      a.out[(size_t)pos * I + n0 + col] = silu_mul(g, u);
    } else {
      a.out[(size_t)a.sorted[pos] * H + n0 + col] = c[r * kCLd + col] * scale;
    }
  }
}

// ---- NVFP4 experts, fast precision, 9 rows and more: the grouped product on mma.sync, codes read in
// place. Block (output tile, sorted tile of up to 8 NB rows of one expert; NB = 8 for prompts, 1 for
// the 9-64 rows of a decode batch, where an expert has a few rows): 8 warps, each a 16-row weight tile
// streamed through its ring (nvfp4_mma::WeightStream), the tile's activations staged per step in
// shared memory (fp16, gathered by row) and shared by the warps (staged_steps, as gemm_nvfp4.cu).
// gate_up: warp w's tile rows 0-7 are gate rows j = 64 bx + 8 w + g, rows 8-15 the matching up rows,
// so a lane holds both sums of an output; it writes act16 by sorted position, fp16(silu(g) * u)
// clamped to fp16's range (as the WMMA kernel's fast operand was). down: 16 consecutive output rows
// per warp, y by pair. Tiles past the sort's count exit at once. At 9-64 decode rows this replaced
// moe_expert_mma_kernel's 8-row tiles (8 warps splitting k, fp32 activations loaded by every warp:
// four activation bytes from L2 per weight byte) in the fast precision.
constexpr int kGroupedWarps = 8;
constexpr int kGroupedDepth = 3;
using GroupedStream = nvfp4_mma::WeightStream<1, kGroupedDepth>;
template <int NB>
constexpr int grouped_stage_bytes() { return 8 * NB * nvfp4_mma::kStagedRowBytes; }
template <int NB>
constexpr int grouped_smem_bytes() {
  return kGroupedDepth * grouped_stage_bytes<NB>() + kGroupedWarps * GroupedStream::kWarpBytes;
}
static_assert(kMoeTileRows == 64 && kMoeGemvTileRows == 8, "the staged product takes 8 or 1 groups of 8 rows");

template <bool GATE_UP, int NB>
__global__ void __launch_bounds__(kGroupedWarps * 32) moe_grouped_nvfp4_kernel(const f16* __restrict__ x16, MoeExperts ex,
                                                                              const int32_t* __restrict__ sorted,
                                                                              const int32_t* __restrict__ tiles,
                                                                              int top_k, float x_scale, f16* __restrict__ act16,
                                                                              float* __restrict__ y) {
  using namespace nvfp4_mma;
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();  // the tiles, and the activations, come from the kernels before
  pdl_launch_dependents();
  const int tl = blockIdx.y;
  if (tl >= tiles[0]) return;
  const int e = tiles[1 + 3 * tl], start = tiles[2 + 3 * tl], rows = tiles[3 + 3 * tl];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int I = ex.inter, H = ex.hidden;
  const int k = GATE_UP ? H : I;
  const WeightView& w = GATE_UP ? ex.gate_up : ex.down;
  const size_t expert_rows = GATE_UP ? 2 * (size_t)I : (size_t)H;
  const int base = GATE_UP ? blockIdx.x * 64 + warp * 8 : blockIdx.x * 128 + warp * 16;

  GroupedStream ws;
  ws.init(smem + kGroupedDepth * grouped_stage_bytes<NB>() + warp * GroupedStream::kWarpBytes, lane, k);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t row = (size_t)e * expert_rows +
                       (GATE_UP ? (size_t)min(base + g, I - 1) + h * (size_t)I : (size_t)min(base + g + 8 * h, H - 1));
    ws.set_row(0, h, static_cast<const uint8_t*>(w.data) + row * (k / 2), w.block_scales + row * (k / 16));
  }
  auto stage = [&](int s, int slot) {
    unsigned char* dst = smem + slot * grouped_stage_bytes<NB>();
    for (int q = threadIdx.x; q < 8 * NB * 16; q += blockDim.x) {
      const int r = q >> 4, c = q & 15;
      const int in = s * kStepInputs + 8 * c;
      const bool ok = r < rows && in < k;
      const int src = ok ? (GATE_UP ? sorted[start + r] / top_k : start + r) : 0;
      cp_async_16(dst + staged_chunk_offset(r, c), x16 + (size_t)src * k + (ok ? in : 0), ok ? 16 : 0);
    }
  };
  const int steps = (k + kStepInputs - 1) / kStepInputs;
#pragma unroll
  for (int d = 0; d < kGroupedDepth - 1; ++d) {
    if (d < steps) ws.issue(d, d);
    cp_async_commit();
  }
#pragma unroll
  for (int d = 0; d < kGroupedDepth - 1; ++d) {
    if (d < steps) stage(d, d);
    cp_async_commit();
  }
  float acc[1][NB][4];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][b][q] = 0.f;
  staged_steps<NB, 1, kGroupedDepth>(ws, stage, 0, steps, smem, grouped_stage_bytes<NB>(), g, t, acc);

  // acc[0][b] = (tile row g, rows 8b + 2t, + 1), (tile row g + 8, the same rows); sums * 2^-14.
  const float scale = (GATE_UP ? expert_scale(ex.gate_up_scales, ex.gate_up.scale, e)
                               : expert_scale(ex.down_scales, ex.down.scale, e)) * x_scale * 16384.f;
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int m = 8 * b + 2 * t + c;
      if (m >= rows) continue;
      if constexpr (GATE_UP) {
        const int j = base + g;
        if (j < I) {
          const float v = silu_mul(acc[0][b][c] * scale, acc[0][b][2 + c] * scale);
          act16[(size_t)(start + m) * I + j] = __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f));
        }
      } else {
        const size_t out_row = (size_t)sorted[start + m] * H;
        if (base + g < H) y[out_row + base + g] = acc[0][b][c] * scale;
        if (base + g + 8 < H) y[out_row + base + g + 8] = acc[0][b][2 + c] * scale;
      }
    }
}

// Block (b, t): outputs kCombineThreads * b .. of row t, one per thread, and the block's partial sum
// of squares. The first version took a row per block: at batch 1 one SM walked the row (~10 us).
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(
    float* __restrict__ resid, const float* __restrict__ y, const float* __restrict__ pair_weight, int top_k,
    int hidden, const float* __restrict__ shared_y, const float* __restrict__ shared_logit, int logit_stride,
    float* __restrict__ sum_squares) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int t = blockIdx.y, n = blockIdx.x * kCombineThreads + threadIdx.x;
  float sq = 0.f;
  if (n < hidden) {
    float v = 0.f;
#pragma unroll 8
    for (int j = 0; j < top_k; ++j)
      v += pair_weight[(size_t)t * top_k + j] * y[((size_t)t * top_k + j) * hidden + n];
    if (shared_y) v += 1.f / (1.f + expf(-shared_logit[(size_t)t * logit_stride])) * shared_y[(size_t)t * hidden + n];
    float* row = resid + (size_t)t * hidden;
    const float r = row[n] + v;
    row[n] = r;
    sq = r * r;
  }
  if (sum_squares) {
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) sum_squares[(size_t)t * gridDim.x + blockIdx.x] = sq;
  }
}

int warp_blocks(int64_t warps) { return (int)((warps * 32 + kWarpThreads - 1) / kWarpThreads); }

void check_experts(const MoeExperts& ex) {
  HEARTH_REQUIRE(ex.experts > 0 && ex.inter > 0 && ex.hidden > 0, "moe: expert sizes must be positive");
  const bool nvfp4 = ex.gate_up.format == WeightFormat::NvFp4;
  HEARTH_REQUIRE(nvfp4 == (ex.down.format == WeightFormat::NvFp4), "moe: gate/up and down differ in format");
  HEARTH_REQUIRE(nvfp4 || (ex.gate_up.format == WeightFormat::Bf16 && ex.down.format == WeightFormat::Bf16),
                 "moe: experts are bf16 or NVFP4");
  HEARTH_REQUIRE(ex.hidden % 16 == 0 && ex.inter % 16 == 0,
                 "moe: hidden and expert sizes must be multiples of 16");
}

// moe_expert_mma_kernel over `blocks_y` pairs (PER_PAIR) or sorted tiles: gate_up's blocks take 8
// outputs (16 rows: gate and up), down's 16.
template <bool PER_PAIR>
void launch_expert_mma(const float* x, const MoeExperts& ex, const int32_t* pair_expert, const int32_t* sorted,
                       const int32_t* tiles, int blocks_y, int top_k, bool gate_up, float* out, cudaStream_t stream) {
  if (gate_up) {
    launch_pdl(moe_expert_mma_kernel<true, PER_PAIR>, dim3((ex.inter + 7) / 8, blocks_y), kMmaWarps * 32, 0, stream,
               x, ex, pair_expert, sorted, tiles, top_k, out);
  } else {
    launch_pdl(moe_expert_mma_kernel<false, PER_PAIR>, dim3((ex.hidden + 15) / 16, blocks_y), kMmaWarps * 32, 0,
               stream, x, ex, pair_expert, sorted, tiles, top_k, out);
  }
  HEARTH_CHECK_LAUNCH("moe_expert_mma_kernel");
}

}  // namespace

bool moe_shape_supported(int hidden, int inter) { return hidden % 16 == 0 && inter % 16 == 0; }

int moe_max_tiles(int pairs, int experts, int tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + std::min(experts, pairs);
}

bool moe_tiled_gemv_supported(const MoeExperts& ex) {
  return ex.gate_up.format == WeightFormat::NvFp4 && ex.hidden % 32 == 0 && ex.inter % 32 == 0;
}

void launch_moe_router(const float* x, const bf16* w, float* logits, int rows, int n, int k,
                       cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && n > 0 && k % 8 == 0, "moe router: bad shape");
  if (rows == 0) return;
  launch_pdl(moe_router_kernel, warp_blocks((int64_t)rows * n), kWarpThreads, 0, stream, x, w, logits, rows, n, k);
  HEARTH_CHECK_LAUNCH("moe_router_kernel");
}

void launch_moe_top_k(const float* logits, int rows, int stride, int experts, int top_k,
                      bool normalize, int32_t* pair_expert, float* pair_weight, cudaStream_t stream) {
  HEARTH_REQUIRE(top_k > 0 && top_k <= 32 && top_k <= experts && stride >= experts,
                 "moe top-k: between 1 and min(32, experts) experts per token");
  if (rows == 0) return;
  launch_pdl(moe_top_k_kernel, warp_blocks(rows), kWarpThreads, 0, stream, logits, rows, stride, experts, top_k,
             normalize ? 1 : 0, pair_expert, pair_weight);
  HEARTH_CHECK_LAUNCH("moe_top_k_kernel");
}

void launch_moe_route(const MoeRoute& r, int rows, cudaStream_t stream) {
  HEARTH_REQUIRE(r.hidden % 8 == 0 && r.router_rows >= r.experts && r.stride >= r.router_rows && r.norm_count > 0,
                 "moe route: bad shape");
  HEARTH_REQUIRE(r.top_k > 0 && r.top_k <= 32 && r.top_k <= r.experts,
                 "moe route: between 1 and min(32, experts) experts per token");
  if (rows == 0) return;
  launch_pdl(moe_route_kernel, dim3((r.router_rows + kRouteWarps - 1) / kRouteWarps, rows), kRouteWarps * 32, 0,
             stream, r);
  HEARTH_CHECK_LAUNCH("moe_route_kernel");
}

void launch_moe_expert_gemv(const float* x, const MoeExperts& ex, const int32_t* pair_expert,
                            int pairs, int top_k, bool gate_up, float* out, cudaStream_t stream) {
  check_experts(ex);
  HEARTH_REQUIRE(top_k > 0, "moe expert gemv: top_k must be positive");
  if (pairs == 0) return;
  const bool nvfp4 = ex.gate_up.format == WeightFormat::NvFp4;
  if (moe_tiled_gemv_supported(ex)) {
    launch_expert_mma<true>(x, ex, pair_expert, nullptr, nullptr, pairs, top_k, gate_up, out, stream);
    return;
  }
  dispatch_format(nvfp4, [&](auto fp4) {
    constexpr bool F = decltype(fp4)::value;
    if (gate_up) {
      launch_pdl(moe_gate_up_gemv_kernel<F>, warp_blocks((int64_t)pairs * ex.inter), kWarpThreads, 0, stream,
                 x, ex, pair_expert, pairs, top_k, out);
    } else {
      launch_pdl(moe_down_gemv_kernel<F>, warp_blocks((int64_t)pairs * ex.hidden), kWarpThreads, 0, stream,
                 x, ex, pair_expert, pairs, out);
    }
    return 0;
  });
  HEARTH_CHECK_LAUNCH("moe_expert_gemv_kernel");
}

void launch_moe_expert_tiles(const float* x, const MoeExperts& ex, const int32_t* sorted, const int32_t* tiles,
                             int max_tiles, int top_k, bool gate_up, float* out, cudaStream_t stream) {
  check_experts(ex);
  HEARTH_REQUIRE(moe_tiled_gemv_supported(ex), "moe expert tiles: NVFP4 experts with sizes a multiple of 32");
  HEARTH_REQUIRE(max_tiles >= 0 && max_tiles <= 65535 && top_k > 0, "moe expert tiles: bad tile count");
  if (max_tiles == 0) return;
  launch_expert_mma<false>(x, ex, nullptr, sorted, tiles, max_tiles, top_k, gate_up, out, stream);
}

void launch_moe_sort(const int32_t* pair_expert, int pairs, int experts, int tile_rows, int32_t* sorted,
                     int32_t* tiles, cudaStream_t stream) {
  HEARTH_REQUIRE(experts > 0 && experts <= kSortThreads * kSortExpertsPerThread && pairs >= 0 && tile_rows > 0,
                 "moe sort: bad sizes");
  launch_pdl(moe_sort_kernel, 1, kSortThreads, 2 * experts * sizeof(int), stream, pair_expert, pairs, experts, tile_rows,
             sorted, tiles);
  HEARTH_CHECK_LAUNCH("moe_sort_kernel");
}

void launch_moe_grouped(const float* x, const MoeExperts& ex, const int32_t* sorted,
                        const int32_t* tiles, int max_tiles, int top_k, bool gate_up, bool split,
                        float* out, cudaStream_t stream) {
  check_experts(ex);
  HEARTH_REQUIRE(max_tiles >= 0 && max_tiles <= 65535, "moe grouped GEMM: more tiles than a grid holds");
  if (max_tiles == 0) return;
  const int n = gate_up ? ex.inter : ex.hidden;
  const dim3 grid((n + kTileN - 1) / kTileN, max_tiles);
  const GroupedArgs args{x, ex, sorted, tiles, top_k, out};
  const bool nvfp4 = ex.gate_up.format == WeightFormat::NvFp4;
  dispatch_format(nvfp4, [&](auto fp4) {
    constexpr bool F = decltype(fp4)::value;
    if (gate_up) {
      if (split) launch_pdl(moe_grouped_kernel<F, true, true>, grid, kGroupedThreads, 0, stream, args);
      else launch_pdl(moe_grouped_kernel<F, false, true>, grid, kGroupedThreads, 0, stream, args);
    } else {
      if (split) launch_pdl(moe_grouped_kernel<F, true, false>, grid, kGroupedThreads, 0, stream, args);
      else launch_pdl(moe_grouped_kernel<F, false, false>, grid, kGroupedThreads, 0, stream, args);
    }
    return 0;
  });
  HEARTH_CHECK_LAUNCH("moe_grouped_kernel");
}

template <int NB>
void launch_grouped_nvfp4(const f16* x16, float x_scale, const MoeExperts& ex, const int32_t* sorted,
                          const int32_t* tiles, int max_tiles, int top_k, bool gate_up, f16* act16, float* y,
                          cudaStream_t stream) {
  static const bool sized = [] {
    HEARTH_CUDA(cudaFuncSetAttribute(moe_grouped_nvfp4_kernel<true, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     grouped_smem_bytes<NB>()));
    HEARTH_CUDA(cudaFuncSetAttribute(moe_grouped_nvfp4_kernel<false, NB>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, grouped_smem_bytes<NB>()));
    return true;
  }();
  (void)sized;
  if (gate_up) {
    launch_pdl(moe_grouped_nvfp4_kernel<true, NB>, dim3((ex.inter + 63) / 64, max_tiles), kGroupedWarps * 32,
               grouped_smem_bytes<NB>(), stream, x16, ex, sorted, tiles, top_k, x_scale, act16, y);
  } else {
    launch_pdl(moe_grouped_nvfp4_kernel<false, NB>, dim3((ex.hidden + 127) / 128, max_tiles), kGroupedWarps * 32,
               grouped_smem_bytes<NB>(), stream, x16, ex, sorted, tiles, top_k, x_scale, act16, y);
  }
  HEARTH_CHECK_LAUNCH("moe_grouped_nvfp4_kernel");
}

void launch_moe_grouped_nvfp4(const f16* x16, float x_scale, const MoeExperts& ex, const int32_t* sorted,
                              const int32_t* tiles, int max_tiles, int tile_rows, int top_k, bool gate_up,
                              f16* act16, float* y, cudaStream_t stream) {
  check_experts(ex);
  HEARTH_REQUIRE(moe_tiled_gemv_supported(ex), "moe grouped nvfp4: NVFP4 experts with sizes a multiple of 32");
  HEARTH_REQUIRE(max_tiles >= 0 && max_tiles <= 65535 && top_k > 0, "moe grouped nvfp4: bad tile count");
  HEARTH_REQUIRE(tile_rows == kMoeTileRows || tile_rows == kMoeGemvTileRows,
                 "moe grouped nvfp4: tiles of kMoeTileRows or kMoeGemvTileRows rows");
  if (max_tiles == 0) return;
  if (tile_rows == kMoeTileRows) launch_grouped_nvfp4<8>(x16, x_scale, ex, sorted, tiles, max_tiles, top_k, gate_up, act16, y, stream);
  else launch_grouped_nvfp4<1>(x16, x_scale, ex, sorted, tiles, max_tiles, top_k, gate_up, act16, y, stream);
}

int moe_combine_blocks(int hidden) { return (hidden + kCombineThreads - 1) / kCombineThreads; }

void launch_moe_combine(float* resid, const float* y, const float* pair_weight, int rows,
                        int top_k, int hidden, const float* shared_y, const float* shared_logit,
                        int logit_stride, float* sum_squares, cudaStream_t stream) {
  if (rows == 0) return;
  launch_pdl(moe_combine_kernel, dim3(moe_combine_blocks(hidden), rows), kCombineThreads, 0, stream, resid, y,
             pair_weight, top_k, hidden, shared_y, shared_logit, logit_stride, sum_squares);
  HEARTH_CHECK_LAUNCH("moe_combine_kernel");
}

}  // namespace hearth
