// What the extension was built with and which CUDA devices it can see.
#pragma once
#include <string>

namespace hearth {

struct BuildInfo {
  bool cuda_compiled = false;
  int cuda_runtime_version = 0;   // e.g. 13000; 0 when CUDA was not compiled in
  int driver_version = 0;         // 0 when no driver answers
  int device_count = 0;
  std::string reason;             // why device_count is 0, empty otherwise
  std::string architectures;      // the CUDA architectures compiled in
};

BuildInfo build_info();

}  // namespace hearth
