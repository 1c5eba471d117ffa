// build_info() for a build without nvcc: no CUDA code is compiled in.
#include "device_info.h"

namespace hearth {

BuildInfo build_info() {
  BuildInfo info;
  info.reason = "this build of Hearth has no CUDA code (nvcc was not found at build time)";
  return info;
}

}  // namespace hearth
