// Kernel launches with programmatic dependent launch (PDL, Hopper and later).
//
// A decode step is ~10 small kernels per layer; between two of them the GPU normally drains the
// first grid, then launches and ramps up the second (a few microseconds each time, ~0.3-1 ms per
// token over a model). With PDL the next kernel of the stream may be launched while the previous
// one is still running: its blocks start, issue what does not depend on the previous kernel (a
// GEMV prefetches its weights into L2), and wait in pdl_wait() until the previous grid has
// finished and its writes are visible. CUDA graphs capture these programmatic edges.
//
// The contract every kernel launched with launch_pdl keeps: call pdl_wait() before its first read
// of anything an earlier kernel wrote and before its first global write. pdl_launch_dependents()
// lets the next kernel launch early; it is called right after the wait, so at most two grids
// overlap. A kernel followed by a library kernel (cuBLASLt) is launched without PDL.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"

namespace hearth {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// True on compute capability 9.0+.
bool pdl_enabled();

// An attribute of the current device, or `fallback` where the runtime cannot say (no device).
int device_attribute(cudaDeviceAttr attr, int fallback);

// The (one) GPU's SM count, read once (132 where the runtime cannot say).
int sm_count();

// The most shared memory one block may opt into on the (one) GPU, read once: 227 KB on Hopper,
// 163 KB on A100, 99 KB on Ada and the consumer Ampere cards (48 KB where the runtime cannot say).
int smem_per_block_optin();

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where enabled, in
// thread-block clusters of `cluster` blocks where that is more than one (sm_90). The caller checks
// the launch with HEARTH_CHECK_LAUNCH as for any launch.
template <typename... Params, typename... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, dim3 cluster,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  int count = 0;
  if (pdl_enabled()) {
    attr[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[count].id = cudaLaunchAttributeClusterDimension;
    attr[count].val.clusterDim.x = cluster.x;
    attr[count].val.clusterDim.y = cluster.y;
    attr[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = count;
  // Errors are left for HEARTH_CHECK_LAUNCH (cudaGetLastError), as with <<<>>>.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, dim3(1, 1, 1), stream, std::forward<Args>(args)...);
}

}  // namespace hearth
