// build_info() for a CUDA build: asks the runtime and the driver what is there,
// turning "no driver" and "no device" into a reason instead of an error.
#include <cuda_runtime.h>

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

int device_attribute(cudaDeviceAttr attr, int fallback) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) {
    cudaGetLastError();  // clear it: later calls start clean
    return fallback;
  }
  return value;
}

int sm_count() {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount, 132);  // one GPU
  return sms;
}

int smem_per_block_optin() {
  static const int bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024);
  return bytes;
}

bool pdl_enabled() {
  static const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, 0);  // one GPU
  return major >= 9;
}

}  // namespace hearth
