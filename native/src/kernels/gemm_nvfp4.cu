// NVFP4 weights times a small batch of fp16 rows (9 .. kGemmNvfp4MaxRows: decode buckets past the
// GEMV, short prompt chunks), the fast precision's product without expanding the weight:
// out[m, n] = (sum_k x16[m, k] * w[n, k]) * x.scale * w.scale, fp32 sums, one fp16 product.
// Before it, each step expanded the whole projection into fp16 (4 bytes written and read back per
// packed byte) for cuBLASLt: the 8B's batch-64 decode spent most of its time there.
//
// Block: 8 warps, 128 weight rows (a 16-row mma tile per warp, the GEMV's lane layout:
// nvfp4_mma.cuh), all of the batch as the mma's columns (NB groups of 8), one k slice. Per step of
// 128 inputs the block stages the batch's activations [8 NB rows x 128] in shared memory (cp.async,
// shared by the 8 warps) while each warp streams its own codes and scales (WeightStream); kDepth - 1
// steps are in flight. Codes become fp16 e2m1 * 2^-14 times the block scale (exact: e2m1 * e4m3 has
// at most 6 significant bits and its smallest value, 2^-10 * 2^-14, is fp16's smallest subnormal).
// Small grids split k over blocks (gridDim.y); the block that finishes a column of tiles last adds
// the slices' partial sums in slice order, so the result does not depend on timing.
#include <algorithm>

#include "../common.cuh"
#include "../launch.cuh"
#include "kernels.h"
#include "nvfp4_mma.cuh"

namespace hearth {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockRows = 16 * kWarps;
constexpr int kDepth = 3;
using nvfp4_mma::kStepInputs;
using Stream = nvfp4_mma::WeightStream<1, kDepth>;
using nvfp4_mma::kStagedRowBytes;

template <int NB>
struct Layout {
  static constexpr int kActStage = 8 * NB * kStagedRowBytes;
  static constexpr int kAct = kDepth * kActStage;
  static constexpr int kBytes = kAct + kWarps * Stream::kWarpBytes;
};

template <int NB>
__global__ void __launch_bounds__(kThreads) gemm_nvfp4_kernel(const f16* __restrict__ x, const uint8_t* __restrict__ codes,
                                                              const uint8_t* __restrict__ block_scales, int rows, int n,
                                                              int k, int steps_per_slice, float alpha,
                                                              float* __restrict__ out, float* __restrict__ partials,
                                                              int* __restrict__ counters) {
  using namespace nvfp4_mma;
  using L = Layout<NB>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int slice = blockIdx.y;
  const int s0 = slice * steps_per_slice;
  const int nsteps = min(steps, s0 + steps_per_slice) - s0;
  const int tile_row0 = blockIdx.x * kBlockRows + warp * 16;

  Stream ws;
  ws.init(smem + L::kAct + warp * Stream::kWarpBytes, lane, k);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t row = (size_t)min(tile_row0 + g + 8 * h, n - 1);
    ws.set_row(0, h, codes + row * (k / 2), block_scales + row * (k / 16));
  }
  // Staged activations: thread q of the block copies chunks q, q + 256, ... of the step.
  auto stage_activations = [&](int s, int slot) {
    unsigned char* stage = smem + slot * L::kActStage;
    for (int q = threadIdx.x; q < 8 * NB * 16; q += kThreads) {
      const int r = q >> 4, c = q & 15;
      const int in = s * kStepInputs + 8 * c;
      const bool ok = r < rows && in < k;
      cp_async_16(stage + staged_chunk_offset(r, c), ok ? x + (size_t)r * k + in : x, ok ? 16 : 0);
    }
  };
  // Groups: the weights of steps 0 .. kDepth - 2 (before the wait: they never change), then their
  // activations, then one group per step (both). Step j is complete once kDepth - 2 groups at most
  // are newer than its own.
#pragma unroll
  for (int d = 0; d < kDepth - 1; ++d) {
    if (d < nsteps) ws.issue(s0 + d, d);
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int d = 0; d < kDepth - 1; ++d) {
    if (d < nsteps) stage_activations(s0 + d, d);
    cp_async_commit();
  }

  float acc[NB][4];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[b][q] = 0.f;

  staged_steps<NB, kDepth>(ws, stage_activations, s0, nsteps, smem, L::kActStage, g, t, acc);

  // acc[b] = (tile row g, batch rows 8b + 2t, + 1), (tile row g + 8, the same batch rows).
  const float scale = alpha * 16384.f;  // the codes' 2^-14
  auto each = [&](auto&& f) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int m = 8 * b + 2 * t + (q & 1), feature = tile_row0 + g + 8 * (q >> 1);
        if (m < rows && feature < n) f(m, feature, acc[b][q]);
      }
  };
  if (gridDim.y == 1) {
    each([&](int m, int f, float v) { out[(size_t)m * n + f] = v * scale; });
    return;
  }
  each([&](int m, int f, float v) { partials[((size_t)slice * rows + m) * n + f] = v; });
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int f0 = blockIdx.x * kBlockRows;
  for (int q = threadIdx.x; q < rows * kBlockRows; q += kThreads) {
    const int m = q / kBlockRows, f = f0 + q % kBlockRows;
    if (f >= n) continue;
    float v = 0.f;
    for (int sl = 0; sl < (int)gridDim.y; ++sl) v += __ldcg(partials + ((size_t)sl * rows + m) * n + f);
    out[(size_t)m * n + f] = v * scale;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // left zero for the next launch
}

template <int NB>
void launch_nb(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k, float* partials,
               int* counters, cudaStream_t stream) {
  const int blocks = (n + kBlockRows - 1) / kBlockRows;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  // About two blocks per multiprocessor: split k when the tiles alone are fewer.
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, 132);
  int slices = std::max(1, std::min(steps, (2 * sms + blocks - 1) / blocks));
  const int per = (steps + slices - 1) / slices;
  slices = (steps + per - 1) / per;
  HEARTH_REQUIRE(slices == 1 || (partials && counters), "gemm_nvfp4: a split product needs partials and counters");
  static const bool sized = [] {
    HEARTH_CUDA(cudaFuncSetAttribute(gemm_nvfp4_kernel<NB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Layout<NB>::kBytes));
    return true;
  }();
  (void)sized;
  launch_pdl(gemm_nvfp4_kernel<NB>, dim3(blocks, slices), kThreads, Layout<NB>::kBytes, stream, x.data,
             static_cast<const uint8_t*>(w.data), w.block_scales, rows, n, k, per, x.scale * w.scale, out, partials,
             counters);
  HEARTH_CHECK_LAUNCH("gemm_nvfp4_kernel");
}

}  // namespace

size_t gemm_nvfp4_partial_bytes(int rows, int n, int k) {
  return (size_t)std::max(1, (k + kStepInputs - 1) / kStepInputs) * rows * n * 4;
}

int gemm_nvfp4_counters(int n) { return (n + kBlockRows - 1) / kBlockRows; }

void launch_gemm_nvfp4(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                       float* partials, int* counters, cudaStream_t stream) {
  HEARTH_REQUIRE(w.format == WeightFormat::NvFp4 && w.data && w.block_scales && x.data,
                 "gemm_nvfp4: needs an NVFP4 weight and the fp16 operand");
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemmNvfp4MaxRows && n > 0 && k > 0 && k % 32 == 0,
                 "gemm_nvfp4: 1..64 rows, k a multiple of 32");
  if (rows <= 16) launch_nb<2>(x, w, out, rows, n, k, partials, counters, stream);
  else if (rows <= 32) launch_nb<4>(x, w, out, rows, n, k, partials, counters, stream);
  else launch_nb<8>(x, w, out, rows, n, k, partials, counters, stream);
}

}  // namespace hearth
