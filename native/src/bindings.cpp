// Python bindings for engine._native. No math here: argument conversion and calls only.
#include <pybind11/pybind11.h>

#include "device_info.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
  m.doc() = "Hearth's compiled engine";
  m.def("build_info", [] {
    hearth::BuildInfo info = hearth::build_info();
    py::dict out;
    out["cuda_compiled"] = info.cuda_compiled;
    out["cuda_runtime_version"] = info.cuda_runtime_version;
    out["driver_version"] = info.driver_version;
    out["device_count"] = info.device_count;
    out["reason"] = info.reason;
    out["architectures"] = info.architectures;
    return out;
  }, "What the extension was compiled with and how many CUDA devices it sees.");
}
