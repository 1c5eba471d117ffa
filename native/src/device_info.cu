// build_info() for a CUDA build: asks the runtime and the driver what is there,
// turning "no driver" and "no device" into a reason instead of an error.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "device_info.h"
#include "launch.cuh"

#ifndef HEARTH_CUDA_ARCH_LIST
#define HEARTH_CUDA_ARCH_LIST ""
#endif

namespace hearth {

BuildInfo build_info() {
  BuildInfo info;
  info.cuda_compiled = true;
  info.architectures = HEARTH_CUDA_ARCH_LIST;
  cudaRuntimeGetVersion(&info.cuda_runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.device_count = 0;
    info.reason = std::string("no CUDA device: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later calls start clean
  } else {
    info.device_count = count;
    if (count == 0) info.reason = "no CUDA device: the driver reports none";
  }
  return info;
}

bool pdl_enabled() {
  const char* v = std::getenv("HEARTH_PDL");
  if (v && std::strcmp(v, "0") == 0) return false;
  static int major = -1;  // one GPU per process; asked once
  if (major < 0) {
    int device = 0, m = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      m = 0;
    }
    major = m;
  }
  return major >= 9;
}

}  // namespace hearth
