// The one error macro of the native engine: every CUDA call is checked; a failure throws
// hearth::CudaError naming the call, the CUDA error, file and line (never exit()). Out-of-memory
// becomes hearth::DeviceOutOfMemory, which Python turns into engine.errors.EngineOutOfMemory.
// Host-safe: included by .cpp runtime files and by common.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace hearth {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeviceOutOfMemory : public std::runtime_error {
 public:
  DeviceOutOfMemory(const std::string& what, size_t needed, size_t free_bytes)
      : std::runtime_error(what), needed(needed), free_bytes(free_bytes) {}
  size_t needed;
  size_t free_bytes;
};

// The KV pool has no free block, or a sequence would exceed its context.
class CacheFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* op, const char* file, int line);

}  // namespace hearth

#define HEARTH_CUDA(call)                                                        \
  do {                                                                           \
    cudaError_t hearth_status_ = (call);                                         \
    if (hearth_status_ != cudaSuccess)                                           \
      ::hearth::throw_cuda_error(hearth_status_, #call, __FILE__, __LINE__);     \
  } while (0)

// Check the launch just made (configuration errors surface here, faults at the next sync).
#define HEARTH_CHECK_LAUNCH(name)                                                \
  do {                                                                           \
    cudaError_t hearth_status_ = cudaGetLastError();                             \
    if (hearth_status_ != cudaSuccess)                                           \
      ::hearth::throw_cuda_error(hearth_status_, "launch of " name, __FILE__, __LINE__); \
  } while (0)

#define HEARTH_REQUIRE(cond, msg)                                                \
  do {                                                                           \
    if (!(cond)) throw std::invalid_argument(std::string(msg));                  \
  } while (0)
