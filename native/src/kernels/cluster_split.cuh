// k split over the blocks of a thread-block cluster (Hopper), for the small-batch NVFP4 product
// (gemm_nvfp4.cu): how many slices a grid takes, and the slices' sums added in
// slice order from distributed shared memory, so the result does not depend on timing and no partial
// sums go through global memory.
#pragma once
#include <cooperative_groups.h>

#include <algorithm>
#include <array>

#include "../common.cuh"
#include "../launch.cuh"

namespace hearth {
namespace cluster_split {

constexpr int kMaxSlices = 8;  // the portable cluster size

// Clusters of s blocks (s = 1 .. kMaxSlices) of `kernel` that run at once on this device (s = 1:
// blocks); 0 where the device has no clusters. Also raises the kernel's dynamic shared-memory limit.
template <typename Kernel>
std::array<int, kMaxSlices + 1> concurrent_clusters(Kernel kernel, int threads, int smem_bytes) {
  HEARTH_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  std::array<int, kMaxSlices + 1> c{};
  int per_sm = 0;
  HEARTH_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  c[1] = per_sm * sm_count();
  if (device_attribute(cudaDevAttrClusterLaunch, 0) == 0) return c;
  for (int s = 2; s <= kMaxSlices; ++s) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = s;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1, s, 1);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem_bytes;
    config.attrs = &attr;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&c[s], kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // this size cannot launch: leave it out
      c[s] = 0;
    }
  }
  return c;
}

// The most k slices (of `steps` steps) whose clusters still run all `blocks` columns at once (more
// blocks busy, one wave), then evened out: every slice gets `per` steps but the last. Returns the
// slice count; *per the steps a slice.
inline int slices_for(int blocks, int steps, const std::array<int, kMaxSlices + 1>& active, int* per) {
  int slices = 1;
  for (int s = 2; s <= std::min(kMaxSlices, steps); ++s)
    if (blocks <= active[s]) slices = s;
  *per = (steps + slices - 1) / slices;
  return (steps + *per - 1) / *per;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// After every block of the cluster left its slice's sums in its own shared memory (`sums`, row m at
// m * stride, the block's `block_rows` output features): block `slice` of S adds rows slice, slice + S,
// ... over the S slices in slice order and writes them times `scale` (features tile0 .. past n left
// out). Every thread of every block calls it; the first sync publishes the sums, the last keeps each
// block's shared memory alive until the others have read it.
template <int kThreads>
__device__ __forceinline__ void add_slices(const float* sums, int stride, int block_rows, int slice, int rows,
                                           int n, int tile0, float scale, float* __restrict__ out) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's sums are in its block's shared memory
  const int S = (int)gridDim.y;
  const int quads = block_rows / 4;
  for (int m = slice; m < rows; m += S)
    for (int c = threadIdx.x; c < quads; c += kThreads) {
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int sl = 0; sl < S; ++sl) {  // in slice order
        const float4 p = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sums, sl) + m * stride + 4 * c);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
      }
      const float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (tile0 + 4 * c + j < n) out[(size_t)m * n + tile0 + 4 * c + j] = r[j] * scale;
    }
  cluster.sync();  // no block leaves while another still reads its shared memory
}
#endif

}  // namespace cluster_split
}  // namespace hearth
