// SwiGLU activation: out[r, i] = silu(gate[r, i]) * up[r, i] with gate_up rows [gate | up]
// (the fused gate/up projection's fp32 output); silu(g) = g / (1 + exp(-g)).
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void swiglu_kernel(const float* __restrict__ gate_up, float* __restrict__ out, int inter) {
  pdl_wait();
  pdl_launch_dependents();
  const float* row = gate_up + (size_t)blockIdx.y * 2 * inter;
  float* dst = out + (size_t)blockIdx.y * inter;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
    const float g = row[i];
    dst[i] = g / (1.f + expf(-g)) * row[inter + i];
  }
}

void launch_swiglu(const float* gate_up, float* out, int rows, int inter, cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && inter > 0, "swiglu: bad shape");
  if (rows == 0) return;
  dim3 grid((inter + 255) / 256 < 64 ? (inter + 255) / 256 : 64, rows);
  launch_pdl(swiglu_kernel, grid, 256, 0, stream, gate_up, out, inter);
  HEARTH_CHECK_LAUNCH("swiglu_kernel");
}

}  // namespace hearth
