// NVFP4 weights times 9 .. kGemmNvfp4MaxRows fp16 rows on Hopper's warpgroup tensor cores (wgmma,
// sm_90a): the small-batch product of gemm_nvfp4.cu (same operands, same result up to the order of
// the fp32 sums), where mma.sync left the tensor pipe and the issue slots mostly idle (ncu, 8B
// gate_up at 64 rows: 2 warps a scheduler, issue 37 %, tensor pipe 32 %, DRAM 23 %).
//
// Block: two warpgroups, 256 weight rows (128 each: the wgmma's n), the batch padded to 64 rows
// (the wgmma's m), one k slice. Per step of 64 inputs every thread copies its own weight row's 32
// code bytes and 4 block scales into a ring (cp.async), the block stages the batch's activations
// [64 x 64] beside them, and each thread decodes its row into fp16 (e2m1 * 2^-14 times the block
// scale: exact, as in gemm_nvfp4.cu) in wgmma's shared-memory layout. Then each warpgroup issues
// its four m64n128k16 products asynchronously and decodes the next step while they run.
// D - 1 steps of codes and activations are in flight (D, the ring's depth: 4 or 6); the decoded
// step is double-buffered.
//
// Status: written without a GPU to run it on (ptxas for sm_90a: 158 registers, no spills, four HGMMA
// a step); not yet run. launch_gemm_nvfp4 takes it only under HEARTH_GEMM_WGMMA, for the A/B against
// the mma.sync kernel (test_gemm_nvfp4_small_batch / test_gemm_nvfp4_bandwidth print both).
//
// Shared-memory layout (no swizzle, K-major, wgmma's "core matrices" of 8 rows x 16 bytes): an
// operand row r's 8-input chunk c is at ((c * R / 8) + r / 8) * 128 + (r % 8) * 16 for an operand of
// R rows, so a k16 slice's two chunks are R * 16 bytes apart (the descriptor's leading offset) and
// its 8-row groups 128 bytes apart (the stride offset). The decode's stores (a warp: 32 rows, one
// chunk) fill 512 contiguous bytes.
//
// Narrow grids split k over a cluster's blocks and add the slices in slice order from distributed
// shared memory, as gemm_nvfp4.cu does (cluster_split.cuh; the result does not depend on timing).
#include <array>
#include <cstdlib>
#include <cstring>

#include "../common.cuh"
#include "../launch.cuh"
#include "cluster_split.cuh"
#include "kernels.h"
#include "nvfp4_mma.cuh"

#ifndef HEARTH_CUDA_ARCH_LIST
#define HEARTH_CUDA_ARCH_LIST ""
#endif

namespace hearth {

namespace {

constexpr int kThreads = 256;   // two warpgroups
constexpr int kBlockRows = 256;  // weight rows a block: one a thread
constexpr int kBatch = 64;       // the wgmma's m: the batch, padded
constexpr int kStep = 64;        // inputs a step
using cluster_split::kMaxSlices;

template <int D>
struct Layout {
  static constexpr int kCodes = kBlockRows * kStep / 2;  // a step's code bytes
  static constexpr int kScales = kBlockRows * 4;
  static constexpr int kAct = kBatch * kStep * 2;
  static constexpr int kDecoded = kBlockRows * kStep * 2;
  static constexpr int kStage = kCodes + kScales + kAct;
  static constexpr int kBytes = D * kStage + 2 * kDecoded;
  static constexpr int kSumStride = kBlockRows + 4;  // the k split's sums [64][kBlockRows], over the rings
  static_assert(kBatch * kSumStride * 4 <= kBytes, "the slice sums fit the block's shared memory");
};

// Byte offset of row r's 8-input chunk c in an operand of R rows (the header's layout).
template <int R>
__device__ __forceinline__ int core_offset(int r, int c) {
  return ((c * (R / 8)) + (r >> 3)) * 128 + (r & 7) * 16;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HEARTH_WGMMA 1
// A wgmma shared-memory descriptor: no swizzle, leading offset `lead` (between the k16 slice's two
// chunks), stride offset 128 (between 8-row groups).
__device__ __forceinline__ uint64_t smem_descriptor(const void* p, uint32_t lead) {
  const uint32_t a = nvfp4_mma::smem_address(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lead >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of the accumulators across a wgmma fence or wait:
// it sees the asynchronous product as finished when its statement is issued.
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Makes this thread's shared-memory writes (stores, landed cp.async) visible to wgmma's reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  // scale-d = 1: D += A B (the accumulators start at zero).
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
#endif

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_nvfp4_wgmma_kernel(const f16* __restrict__ x, const uint8_t* __restrict__ codes,
                            const uint8_t* __restrict__ block_scales, int rows, int n, int k, int steps_per_slice,
                            float alpha, float* __restrict__ out) {
#ifdef HEARTH_WGMMA
  using namespace nvfp4_mma;
  using L = Layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, g = lane >> 2, t = lane & 3;
  const int steps = k / kStep;
  const int slice = blockIdx.y;
  const int s0 = slice * steps_per_slice;
  const int nsteps = min(steps, s0 + steps_per_slice) - s0;
  const int tile0 = blockIdx.x * kBlockRows;
  unsigned char* const decoded = smem + D * L::kStage;

  // This thread's weight row (clamped: rows past n are read, never stored).
  const size_t row = (size_t)min(tile0 + tid, n - 1);
  const uint8_t* const row_codes = codes + row * (k / 2);
  const uint8_t* const row_scales = block_scales + row * (k / 16);  // k % 64 == 0: 4-byte aligned
  auto stage = [&](int slot) { return smem + slot * L::kStage; };
  auto issue_weights = [&](int s, int slot) {
    unsigned char* st = stage(slot);
    cp_async_16(st + tid * 32, row_codes + (size_t)s * (kStep / 2), 16);
    cp_async_16(st + tid * 32 + 16, row_codes + (size_t)s * (kStep / 2) + 16, 16);
    cp_async_4(st + L::kCodes + tid * 4, row_scales + (size_t)s * (kStep / 16), 4);
  };
  auto issue_activations = [&](int s, int slot) {
    unsigned char* act = stage(slot) + L::kCodes + L::kScales;
#pragma unroll
    for (int q = tid; q < kBatch * kStep / 8; q += kThreads) {
      const int m = q >> 3, c = q & 7;
      const bool ok = m < rows;
      cp_async_16(act + core_offset<kBatch>(m, c), ok ? x + (size_t)m * k + (size_t)s * kStep + 8 * c : x, ok ? 16 : 0);
    }
  };

  // Groups as in gemm_nvfp4.cu: the weights of steps 0 .. D - 2 (before the wait: they never
  // change), then their activations, then one group per step; step j is complete once at most
  // D - 2 newer groups are in flight.
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (d < nsteps) issue_weights(s0 + d, d);
    cp_async_commit();
  }
  pdl_wait();
  pdl_launch_dependents();
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (d < nsteps) issue_activations(s0 + d, d);
    cp_async_commit();
  }

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;

  for (int j = 0; j < nsteps; ++j) {
    const int slot = j % D;
    cp_async_wait<D - 2>();
    // Decode: this thread's row, 64 codes (8 words of 8) into fp16 pairs in input order.
    {
      const unsigned char* st = stage(slot);
      const uint4 c0 = *reinterpret_cast<const uint4*>(st + tid * 32);
      const uint4 c1 = *reinterpret_cast<const uint4*>(st + tid * 32 + 16);
      const uint32_t sw = *reinterpret_cast<const uint32_t*>(st + L::kCodes + tid * 4);
      const uint32_t words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      const __half2 s01 = block_scales_f16(sw), s23 = block_scales_f16(sw >> 16);
      const __half2 sv[4] = {__low2half2(s01), __high2half2(s01), __low2half2(s23), __high2half2(s23)};
      unsigned char* dec = decoded + (j & 1) * L::kDecoded;
#pragma unroll
      for (int c = 0; c < 8; ++c) {  // word c: inputs 8c .. 8c + 7, block c / 2
        const uint32_t q = words[c];
        const uint32_t p0 = f16_mul2(e2m1_pair_f16<0>(q), sv[c >> 1]);  // inputs (0, 4)
        const uint32_t p1 = f16_mul2(e2m1_pair_f16<1>(q), sv[c >> 1]);  // (1, 5)
        const uint32_t p2 = f16_mul2(e2m1_pair_f16<2>(q), sv[c >> 1]);  // (2, 6)
        const uint32_t p3 = f16_mul2(e2m1_pair_f16<3>(q), sv[c >> 1]);  // (3, 7)
        const uint4 v = make_uint4(prmt(p0, p1, 0x5410), prmt(p2, p3, 0x5410), prmt(p0, p1, 0x7632),
                                   prmt(p2, p3, 0x7632));
        *reinterpret_cast<uint4*>(dec + core_offset<kBlockRows>(tid, c)) = v;
      }
    }
    fence_async_shared();
    __syncthreads();  // step j decoded and staged by every thread
    {
      const unsigned char* act = stage(slot) + L::kCodes + L::kScales;
      const unsigned char* dec = decoded + (j & 1) * L::kDecoded + wg * (128 / 8) * 128;
      fence_operands(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kStep / 16; ++kk)
        wgmma_m64n128k16(acc, smem_descriptor(act + kk * 2 * (kBatch / 8) * 128, kBatch * 16),
                         smem_descriptor(dec + kk * 2 * (kBlockRows / 8) * 128, kBlockRows * 16));
      wgmma_commit();
      fence_operands(acc);
    }
    wgmma_wait<1>();  // step j - 1's products are done (this warpgroup)
    __syncthreads();  // ... in both: its stage and decode buffer are free
    const int ahead = j + D - 1;
    if (ahead < nsteps) {
      issue_weights(s0 + ahead, ahead % D);
      issue_activations(s0 + ahead, ahead % D);
    }
    cp_async_commit();
  }
  wgmma_wait<0>();
  fence_operands(acc);

  // acc[4 jn + q]: batch row 16 (warp % 4) + g + 8 (q / 2), weight row 128 wg + 8 jn + 2 t + q % 2.
  const float scale = alpha * 16384.f;  // the codes' 2^-14
  const int m0 = 16 * (warp & 3) + g;
  if (gridDim.y == 1) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int m = m0 + 8 * ((i >> 1) & 1), f = tile0 + 128 * wg + 8 * (i >> 2) + 2 * t + (i & 1);
      if (m < rows && f < n) out[(size_t)m * n + f] = acc[i] * scale;
    }
    return;
  }
  cp_async_wait<0>();
  __syncthreads();  // every thread is past its last read of the rings: the sums reuse that memory
  float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 64; ++i)
    sums[(m0 + 8 * ((i >> 1) & 1)) * L::kSumStride + 128 * wg + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i];
  cluster_split::add_slices<kThreads>(sums, L::kSumStride, kBlockRows, slice, rows, n, tile0, scale, out);
#else
  __trap();  // launched only where the build has sm_90a code (gemm_nvfp4_wgmma_supported)
#endif
}

template <int D>
const std::array<int, kMaxSlices + 1>& concurrent_clusters() {
  static const auto counts =
      cluster_split::concurrent_clusters(gemm_nvfp4_wgmma_kernel<D>, kThreads, Layout<D>::kBytes);
  return counts;
}

template <int D>
void launch_depth(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k, cudaStream_t stream) {
  const int blocks = (n + kBlockRows - 1) / kBlockRows;
  const int steps = k / kStep;
  int per = 0;
  const int slices = cluster_split::slices_for(blocks, steps, concurrent_clusters<D>(), &per);
  launch_pdl_cluster(gemm_nvfp4_wgmma_kernel<D>, dim3(blocks, slices), kThreads, Layout<D>::kBytes,
                     dim3(1, slices, 1), stream, x.data, static_cast<const uint8_t*>(w.data), w.block_scales, rows,
                     n, k, per, x.scale * w.scale, out);
  HEARTH_CHECK_LAUNCH("gemm_nvfp4_wgmma_kernel");
}

}  // namespace

bool gemm_nvfp4_wgmma_supported(int rows, int n, int k) {
  static const bool hopper = [] {
    const bool built = std::strstr(HEARTH_CUDA_ARCH_LIST, "90a") != nullptr;
    return built && device_attribute(cudaDevAttrComputeCapabilityMajor, 0) == 9 &&
           device_attribute(cudaDevAttrComputeCapabilityMinor, 0) == 0;
  }();
  return hopper && rows >= 1 && rows <= kBatch && n > 0 && k > 0 && k % kStep == 0;
}

void launch_gemm_nvfp4_wgmma(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                             cudaStream_t stream) {
  HEARTH_REQUIRE(w.format == WeightFormat::NvFp4 && w.data && w.block_scales && x.data,
                 "gemm_nvfp4: needs an NVFP4 weight and the fp16 operand");
  HEARTH_REQUIRE(gemm_nvfp4_wgmma_supported(rows, n, k),
                 "gemm_nvfp4_wgmma: needs a build with sm_90a code, a compute capability 9.0 GPU, 1..64 rows and "
                 "k a multiple of 64");
  // Ring stages: depth - 1 steps of codes and activations in flight (27 or 46 KB a block).
  if (gemm_nvfp4_wgmma_depth() == 4) launch_depth<4>(x, w, out, rows, n, k, stream);
  else launch_depth<6>(x, w, out, rows, n, k, stream);
}

int gemm_nvfp4_wgmma_depth() {
  static const int depth = [] {
    const char* e = std::getenv("HEARTH_GEMM_WGMMA");
    if (!e || !*e || std::strcmp(e, "0") == 0) return 0;
    return std::strcmp(e, "4") == 0 ? 4 : 6;
  }();
  return depth;
}

}  // namespace hearth
