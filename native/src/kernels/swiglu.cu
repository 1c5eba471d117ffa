// SwiGLU activation: out[r, i] = silu(gate[r, i]) * up[r, i] with gate_up rows [gate | up]
// (the fused gate/up projection's fp32 output); silu(g) = g / (1 + exp(-g)).
// For the stacked decode GEMM, gate_up may come as the two halves of a stacked product (gate_up +
// gate_up_lo) and the output go out as the down product's bf16 hi / lo operand: the same bits as
// add-halves, swiglu and split one after the other.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void swiglu_kernel(const float* __restrict__ gate_up, const float* __restrict__ gate_up_lo,
                              float* __restrict__ out, bf16* __restrict__ out_hi,
                              bf16* __restrict__ out_lo, int inter) {
  pdl_wait();
  pdl_launch_dependents();
  const size_t in_row = (size_t)blockIdx.y * 2 * inter, out_row = (size_t)blockIdx.y * inter;
  const float* row = gate_up + in_row;
  const float* row_lo = gate_up_lo ? gate_up_lo + in_row : nullptr;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
    const float g = row_lo ? row[i] + row_lo[i] : row[i];
    const float u = row_lo ? row[inter + i] + row_lo[inter + i] : row[inter + i];
    store_operand(out, out_hi, out_lo, out_row + i, g / (1.f + expf(-g)) * u);
  }
}

void launch_swiglu(const float* gate_up, float* out, int rows, int inter, cudaStream_t stream,
                   const float* gate_up_lo, bf16* out_hi, bf16* out_lo) {
  HEARTH_REQUIRE(rows >= 0 && inter > 0, "swiglu: bad shape");
  HEARTH_REQUIRE((out != nullptr) != (out_hi != nullptr && out_lo != nullptr),
                 "swiglu: one output, fp32 or bf16 hi / lo");
  if (rows == 0) return;
  dim3 grid((inter + 255) / 256 < 64 ? (inter + 255) / 256 : 64, rows);
  launch_pdl(swiglu_kernel, grid, 256, 0, stream, gate_up, gate_up_lo, out, out_hi, out_lo, inter);
  HEARTH_CHECK_LAUNCH("swiglu_kernel");
}

}  // namespace hearth
