// Bias add on a matrix product's fp32 output: x[r, c] += bias[c] (Qwen2's q/k/v projections).
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void add_bias_kernel(float* __restrict__ x, const bf16* __restrict__ bias, int cols) {
  pdl_wait();
  pdl_launch_dependents();
  float* row = x + (size_t)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] += __bfloat162float(bias[c]);
}

void launch_add_bias(float* x, const bf16* bias, int rows, int cols, cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && cols > 0, "add_bias: bad shape");
  if (rows == 0) return;
  launch_pdl(add_bias_kernel, rows, 256, 0, stream, x, bias, cols);
  HEARTH_CHECK_LAUNCH("add_bias_kernel");
}

}  // namespace hearth
