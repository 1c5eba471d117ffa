// The native engine's environment switches (HEARTH_*), read where each choice is made so one
// process can compare paths (hearth bench --ab). Host-only.
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
