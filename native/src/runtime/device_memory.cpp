// Allocation with out-of-memory reporting (bytes asked for, bytes free).
#include "device_memory.h"

#include <string>

namespace hearth {

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t status = cudaMalloc(&ptr_, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    ptr_ = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw DeviceOutOfMemory(std::string("out of GPU memory allocating ") + what + ": " +
                                std::to_string(bytes) + " bytes needed, " +
                                std::to_string(free_b) + " free",
                            bytes, free_b);
  }
  if (status != cudaSuccess) {
    ptr_ = nullptr;
    throw_cuda_error(status, (std::string("cudaMalloc of ") + what).c_str(), __FILE__, __LINE__);
  }
}

void DeviceBuffer::reset() {
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) HEARTH_CUDA(cudaMallocHost(&ptr_, bytes));
}

}  // namespace hearth
