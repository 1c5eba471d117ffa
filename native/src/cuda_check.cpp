// The error path shared by every CUDA file: build the message and throw.
#include <string>

#include "cuda_check.h"

namespace hearth {

void throw_cuda_error(cudaError_t status, const char* op, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the process stays usable
  std::string msg = std::string("CUDA error in ") + op + ": " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line);
  if (status == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    throw DeviceOutOfMemory(msg, 0, free_b);
  }
  throw CudaError(msg);
}

}  // namespace hearth
