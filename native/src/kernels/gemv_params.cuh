// What a decode GEMV launch carries, shared by the 16-bit GEMV (gemv.cu) and the NVFP4 one
// (gemv_nvfp4.cu) so both take the same fusions with the same meaning.
#pragma once
#include "kernels.h"

namespace hearth {

// What a GEMV launch does around the product (bits of a kernel's MODE).
constexpr int kModeSwiglu = 1;    // gate/up pairs combined as silu(gate) * up (launch_gemv_swiglu)
constexpr int kModeNorm = 2;      // x rows RMS-normalized on the fly (GemvNorm)
constexpr int kModeResidual = 4;  // out += product, sums of squares of the new rows (GemvResidual)
constexpr int kModeRope = 8;      // dim pairs of the qkv heads rotated and stored (launch_gemv_rope)
constexpr int kGemvRopeMaxRows = 4;

struct GemvParams {
  const float* x;
  const void* w;
  float w_scale;  // true weight = stored * w_scale (a power of two; 1 for bf16; NVFP4's global scale)
  float* out;
  int n, k;
  // kModeNorm: x[r] * rsqrt(sum(norm_partials[r, :norm_count]) / k + eps) * norm_weight
  const bf16* norm_weight;
  const float* norm_partials;
  int norm_count;
  float eps;
  // kModeResidual: the block's sum of squares of each new out row, at [r, blockIdx.x]
  float* resid_partials;
  // kModeRope: where the rotated heads go
  RopeTarget rope;
  // The fast precision over NVFP4 weights (GemvFast): one fp16 product; the activations go into
  // fp16 divided by x_scale, or per row by the power of two its max |x| asks for (the producer's
  // partials x_amax [rows, x_amax_count]); a SwiGLU product leaves each row's per-block max |y| at
  // amax_out [rows, blocks]. False: the exact precision's bf16 hi + lo products.
  bool fast = false;
  float x_scale = 1.f;
  const float* x_amax = nullptr;
  int x_amax_count = 0;
  float* amax_out = nullptr;
};

// gemv_nvfp4.cu: the NVFP4 GEMV of one launch (any mode above), its blocks and its pairing rule.
void launch_gemv_nvfp4(const GemvParams& prm, const uint8_t* block_scales, int rows, int mode,
                       cudaStream_t stream);
int gemv_nvfp4_blocks(int rows, int n);

}  // namespace hearth
