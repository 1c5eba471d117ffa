// NVFP4 weights times a small batch of fp16 rows (9 .. kGemmNvfp4MaxRows: decode buckets past the
// GEMV, short prompt chunks), the fast precision's product without expanding the weight:
// out[m, n] = (sum_k x16[m, k] * w[n, k]) * x.scale * w.scale, fp32 sums, one fp16 product.
// Before it, each step expanded the whole projection into fp16 (4 bytes written and read back per
// packed byte) for cuBLASLt: the 8B's batch-64 decode spent most of its time there.
//
// Block: 8 warps, each FT 16-row mma tiles of the weight (the GEMV's lane layout: nvfp4_mma.cuh),
// all of the batch as the mma's columns (NB groups of 8), one k slice. Per step of 128 inputs the
// block stages the batch's activations [8 NB rows x 128] in shared memory (cp.async, shared by the
// 8 warps) while each warp streams its own codes and scales (WeightStream); kDepth - 1 steps are in
// flight. Codes become fp16 e2m1 * 2^-14 times the block scale (exact: e2m1 * e4m3 has at most 6
// significant bits and its smallest value, 2^-10 * 2^-14, is fp16's smallest subnormal). Two tiles
// a warp (256 weight rows a block, past 16 rows) halve the activation bytes each weight byte costs,
// in shared memory and from L2.
//
// Narrow grids split k over the blocks of a thread-block cluster (Hopper): each block leaves its
// sums in its own shared memory, and after a cluster barrier block r adds rows r, r + S, ... of
// the tile over the S slices in slice order, reading the others' shared memory (DSMEM), so the
// result does not depend on timing and no partial sums go through global memory (cluster_split.cuh).
// The first version split k through global partials that the column's last block added up alone; at
// 64 rows that tail and the partials' traffic (slices x rows x n x 8 bytes) took most of its time.
// Devices without clusters (before sm_90) run one slice.
#include <array>

#include "../common.cuh"
#include "../launch.cuh"
#include "cluster_split.cuh"
#include "kernels.h"
#include "nvfp4_mma.cuh"

namespace hearth {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kDepth = 3;
using cluster_split::kMaxSlices;
using nvfp4_mma::kStagedRowBytes;
using nvfp4_mma::kStepInputs;

template <int NB, int FT>
struct Layout {
  using Stream = nvfp4_mma::WeightStream<FT, kDepth>;
  static constexpr int kBlockRows = 16 * FT * kWarps;
  static constexpr int kActStage = 8 * NB * kStagedRowBytes;
  static constexpr int kAct = kDepth * kActStage;
  static constexpr int kBytes = kAct + kWarps * Stream::kWarpBytes;
  // The k split's sums [8 NB][kBlockRows] over the same memory, rows 4 floats apart more than the
  // tile: a store's lanes (rows 2t + c, features g) then hit 32 distinct banks.
  static constexpr int kSumStride = kBlockRows + 4;
  static_assert(8 * NB * kSumStride * 4 <= kBytes, "the slice sums fit the block's shared memory");
};

template <int NB, int FT>
__global__ void __launch_bounds__(kThreads) gemm_nvfp4_kernel(const f16* __restrict__ x, const uint8_t* __restrict__ codes,
                                                              const uint8_t* __restrict__ block_scales, int rows, int n,
                                                              int k, int steps_per_slice, float alpha,
                                                              float* __restrict__ out) {
  using namespace nvfp4_mma;
  using L = Layout<NB, FT>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  const int slice = blockIdx.y;
  const int s0 = slice * steps_per_slice;
  const int nsteps = min(steps, s0 + steps_per_slice) - s0;
  const int warp_row0 = warp * 16 * FT;  // within the block's tile
  const int tile0 = blockIdx.x * L::kBlockRows;

  typename L::Stream ws;
  ws.init(smem + L::kAct + warp * L::Stream::kWarpBytes, lane, k);
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t row = (size_t)min(tile0 + warp_row0 + 16 * i + g + 8 * h, n - 1);
      ws.set_row(i, h, codes + row * (k / 2), block_scales + row * (k / 16));
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

  float acc[FT][NB][4];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][b][q] = 0.f;

  staged_steps<NB, FT, kDepth>(ws, stage_activations, s0, nsteps, smem, L::kActStage, g, t, acc);

  // acc[i][b] = (tile i row g, batch rows 8b + 2t, + 1), (tile i row g + 8, the same batch rows).
  const float scale = alpha * 16384.f;  // the codes' 2^-14
  if (gridDim.y == 1) {
#pragma unroll
    for (int i = 0; i < FT; ++i)
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int m = 8 * b + 2 * t + (q & 1), f = tile0 + warp_row0 + 16 * i + g + 8 * (q >> 1);
          if (m < rows && f < n) out[(size_t)m * n + f] = acc[i][b][q] * scale;
        }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cp_async_wait<0>();
  __syncthreads();  // every warp is past its last read of the rings: the sums reuse that memory
  float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        sums[(8 * b + 2 * t + (q & 1)) * L::kSumStride + warp_row0 + 16 * i + g + 8 * (q >> 1)] = acc[i][b][q];
  cluster_split::add_slices<kThreads>(sums, L::kSumStride, L::kBlockRows, slice, rows, n, tile0, scale, out);
#endif
}

template <int NB, int FT>
const std::array<int, kMaxSlices + 1>& concurrent_clusters() {
  static const auto counts =
      cluster_split::concurrent_clusters(gemm_nvfp4_kernel<NB, FT>, kThreads, Layout<NB, FT>::kBytes);
  return counts;
}

template <int NB, int FT>
void launch_tiles(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                  cudaStream_t stream) {
  using L = Layout<NB, FT>;
  const int blocks = (n + L::kBlockRows - 1) / L::kBlockRows;
  const int steps = (k + kStepInputs - 1) / kStepInputs;
  int per = 0;
  const int slices = cluster_split::slices_for(blocks, steps, concurrent_clusters<NB, FT>(), &per);
  launch_pdl_cluster(gemm_nvfp4_kernel<NB, FT>, dim3(blocks, slices), kThreads, L::kBytes, dim3(1, slices, 1),
                     stream, x.data, static_cast<const uint8_t*>(w.data), w.block_scales, rows, n, k, per,
                     x.scale * w.scale, out);
  HEARTH_CHECK_LAUNCH("gemm_nvfp4_kernel");
}

}  // namespace

// Tiles a warp: two past 16 rows, one up to 16 (where the mma columns are few, the activation bytes
// were no limit, and one keeps twice the blocks). Measured on the H100 at 32 / 64 rows with either
// (test_gemm_nvfp4_bandwidth), two were faster or level on every 8B and Qwen3-30B-A3B shape but the
// 8B down at 32 rows (48.3 against 46.3 us); e.g. 8B qkv at 32 rows 26.6 -> 19.1 us, gate_up at 64
// rows 108.5 -> 85.0, MoE o at 64 rows 18.8 -> 16.4.
void launch_gemm_nvfp4(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                       cudaStream_t stream) {
  HEARTH_REQUIRE(w.format == WeightFormat::NvFp4 && w.data && w.block_scales && x.data,
                 "gemm_nvfp4: needs an NVFP4 weight and the fp16 operand");
  HEARTH_REQUIRE(rows >= 1 && rows <= kGemmNvfp4MaxRows && n > 0 && k > 0 && k % 32 == 0,
                 "gemm_nvfp4: 1..64 rows, k a multiple of 32");
  if (rows <= 16) launch_tiles<2, 1>(x, w, out, rows, n, k, stream);
  else if (rows <= 32) launch_tiles<4, 2>(x, w, out, rows, n, k, stream);
  else launch_tiles<8, 2>(x, w, out, rows, n, k, stream);
}

}  // namespace hearth
