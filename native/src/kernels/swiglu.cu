// SwiGLU activation: y[r, i] = silu(gate[r, i]) * up[r, i] with gate_up rows [gate | up]
// (the fused gate/up projection's fp32 output); silu(g) = g / (1 + exp(-g)).
// Out as fp32 (many blocks per row), or as the fast down product's fp16 operand: y is the one
// activation of a layer with no bound known at load (its rows reach 1e3-1e4 in some models, past
// fp16's 65504 once multiplied out), so each row is scaled by the power of two that brings its
// largest |y| into [2^14, 2^15): one block per row holds the row in registers, takes its max, then
// writes fp16(y / s) and s. The rmsnorm that adds the down product into the residual applies s.
#include <cmath>

#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }

__global__ void swiglu_kernel(const float* __restrict__ gate_up, float* __restrict__ out, int inter) {
  pdl_wait();
  pdl_launch_dependents();
  const float* row = gate_up + (size_t)blockIdx.y * 2 * inter;
  float* dst = out + (size_t)blockIdx.y * inter;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x)
    dst[i] = silu_mul(row[i], row[inter + i]);
}

constexpr int kRowThreads = 1024;

template <int PER>  // values per thread: inter <= PER * kRowThreads
__global__ void __launch_bounds__(kRowThreads) swiglu_f16_kernel(const float* __restrict__ gate_up,
                                                                 f16* __restrict__ out,
                                                                 float* __restrict__ row_scale,
                                                                 int inter) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const float* row = gate_up + (size_t)blockIdx.x * 2 * inter;
  float y[PER];
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    y[j] = i < inter ? silu_mul(row[i], row[inter + i]) : 0.f;
    m = fmaxf(m, fabsf(y[j]));
  }
  m = block_max(m, scratch);
  // fp16_operand_scale on the device: m in [2^(e-1), 2^e) -> s = 2^(e-15).
  int e = 0;
  const bool scaled = m > 0.f && isfinite(m);
  if (scaled) frexpf(m, &e);
  const float inv = scaled ? ldexpf(1.f, 15 - e) : 1.f;
  if (threadIdx.x == 0) row_scale[blockIdx.x] = scaled ? ldexpf(1.f, e - 15) : 1.f;
  f16* dst = out + (size_t)blockIdx.x * inter;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * kRowThreads;
    if (i < inter) dst[i] = __float2half_rn(y[j] * inv);
  }
}

void launch_swiglu(const float* gate_up, float* out, int rows, int inter, cudaStream_t stream,
                   f16* out16, float* row_scale) {
  HEARTH_REQUIRE(rows >= 0 && inter > 0, "swiglu: bad shape");
  HEARTH_REQUIRE((out != nullptr) != (out16 != nullptr && row_scale != nullptr),
                 "swiglu: one output, fp32 or fp16 with its row scales");
  if (rows == 0) return;
  if (out) {
    dim3 grid((inter + 255) / 256 < 64 ? (inter + 255) / 256 : 64, rows);
    launch_pdl(swiglu_kernel, grid, 256, 0, stream, gate_up, out, inter);
    HEARTH_CHECK_LAUNCH("swiglu_kernel");
    return;
  }
  const int per = (inter + kRowThreads - 1) / kRowThreads;
  if (per <= 4)
    launch_pdl(swiglu_f16_kernel<4>, rows, kRowThreads, 0, stream, gate_up, out16, row_scale, inter);
  else if (per <= 8)
    launch_pdl(swiglu_f16_kernel<8>, rows, kRowThreads, 0, stream, gate_up, out16, row_scale, inter);
  else if (per <= 16)
    launch_pdl(swiglu_f16_kernel<16>, rows, kRowThreads, 0, stream, gate_up, out16, row_scale, inter);
  else if (per <= 32)
    launch_pdl(swiglu_f16_kernel<32>, rows, kRowThreads, 0, stream, gate_up, out16, row_scale, inter);
  else
    throw std::invalid_argument("swiglu: intermediate sizes above 32,768 are not supported");
  HEARTH_CHECK_LAUNCH("swiglu_f16_kernel");
}

}  // namespace hearth
