// The native engine's one environment switch, HEARTH_CUDA_GRAPHS=0 (decode without CUDA graphs,
// for bug reports); everything else is chosen from the shape at load or by a load option.
// Host-only.
#pragma once
#include <cstdlib>
#include <cstring>

namespace hearth {

// True when the variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

}  // namespace hearth
