// Entry points for the kernel tests: each runs one launcher on device pointers the caller owns
// (torch tensors' data_ptr()), on the default stream, then synchronizes so faults surface here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace hearth::checks {

// fp16 / scale: the table or weight in the fast precision's format (kernels.h WeightView).
void embedding(uintptr_t ids, int tokens, uintptr_t table, int vocab, int hidden, uintptr_t out,
               bool fp16, float scale);
// out16 != 0: the fp16 operand output instead of out.
void rmsnorm_residual(uintptr_t residual, uintptr_t delta, uintptr_t weight, uintptr_t out,
                      int rows, int hidden, float eps, uintptr_t delta_row_scale, uintptr_t out16,
                      float out16_scale);
void add_bias(uintptr_t x, uintptr_t bias, int rows, int cols);
void head_rmsnorm(uintptr_t x, int rows, int row_stride, int col0, int heads, int head_dim,
                  uintptr_t weight, float eps);
std::vector<float> rope_inv_freq(const ModelConfig& config);
// q_norm / k_norm != 0: each query / key head RMSNorm'd first (Qwen3).
void rope_kv_write(uintptr_t qkv, int tokens, int heads, int kv_heads, int head_dim,
                   uintptr_t positions, uintptr_t slots, uintptr_t inv_freq, uintptr_t q_out,
                   uintptr_t k_cache, uintptr_t v_cache, uintptr_t q_norm, uintptr_t k_norm, float eps);
// mode "decode" (split along the keys, split_len) or "prefill".
void paged_attention(const std::string& mode, uintptr_t q, uintptr_t k_cache, uintptr_t v_cache,
                     uintptr_t block_tables, uintptr_t row_table, uintptr_t kv_lens, uintptr_t out,
                     int rows, int heads, int kv_heads, int head_dim, int block_size,
                     int max_blocks, float scale, int split_len);
// out16 != 0: the fp16 operand with its row scales instead of out.
void swiglu(uintptr_t gate_up, uintptr_t out, int rows, int inter, uintptr_t out16,
            uintptr_t row_scale);
// The GEMV with its RMSNorm prologue (norm_weight != 0) or residual epilogue (residual_partials != 0).
void gemv_fused(uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k,
                uintptr_t norm_weight, uintptr_t norm_partials, int norm_count, float eps,
                uintptr_t residual_partials, bool fp16, float w_scale);
// One decode-attention launch on the default stream, no synchronization (timed by the caller);
// max_splits 32; part_ml / part_acc / counters as launch_decode_attention wants them.
void decode_attention_launch(uintptr_t q, uintptr_t k_cache, uintptr_t v_cache,
                             uintptr_t block_tables, uintptr_t row_table, uintptr_t kv_lens,
                             uintptr_t out, int rows, int heads, int kv_heads, int head_dim,
                             int block_size, int max_blocks, float scale, uintptr_t part_ml,
                             uintptr_t part_acc, uintptr_t counters);
// The GEMV over an NVFP4 weight (codes [n, k/2], block scales [n, k/16], global scale).
// fast: one fp16 product, the activations divided by x_scale or by their rows' scales from x_amax
// partials [rows, x_amax_count] (x_amax != 0); else the exact bf16 hi + lo products.
void gemv_nvfp4(uintptr_t x, uintptr_t codes, uintptr_t block_scales, float global_scale,
                uintptr_t out, int rows, int n, int k, bool fast, float x_scale, uintptr_t x_amax,
                int x_amax_count);
// The small-batch NVFP4 product (fast precision): out = (x16 @ w^T) * x_scale * global_scale.
void gemm_nvfp4(uintptr_t x16, float x_scale, uintptr_t codes, uintptr_t block_scales, float global_scale,
                uintptr_t out, int rows, int n, int k);
// Seconds per product over `copies` NVFP4 weights in turn: gemm_nvfp4 reading the codes, or
// (expand) the expansion into fp16 and cuBLASLt, as decode buckets past the GEMV ran before it.
double gemm_nvfp4_seconds(uintptr_t x16, uintptr_t codes, uintptr_t block_scales, uintptr_t out, int rows, int n,
                          int k, int copies, int reps, bool expand);
// An NVFP4 weight expanded into 16 bits (fp16 or bf16) for the tensor-core product.
void nvfp4_expand(uintptr_t codes, uintptr_t block_scales, uintptr_t out, int n, int k, bool fp16);
// False (nothing launched) where the fused gate/up + SwiGLU GEMV does not take the shape.
bool gemv_swiglu(uintptr_t x, uintptr_t w_gate_up, uintptr_t out, int rows, int inter, int k);
// The exact product over bf16 weights: path "gemv", "gemm" (cuBLASLt when loadable) or "tiled".
void matmul(const std::string& path, uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k);
// The fast product: out = (x16 @ w16^T) * x_scale * w_scale.
void gemm_fast(uintptr_t x16, float x_scale, uintptr_t w16, float w_scale, uintptr_t out, int rows,
               int n, int k);
void convert_to_f16(uintptr_t src, uintptr_t dst, int64_t count, float scale);
float amax_bf16(uintptr_t x, int64_t count);
void bf16_to_f16_inplace(uintptr_t data, int64_t count, float scale);
// Seconds per GEMV launch, averaged over `reps` back-to-back launches (CUDA events), cycling over
// `copies` weight matrices laid end to end at w so the weights come from HBM, not L2.
double gemv_seconds(uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k, int copies,
                    int reps);
double gemv_nvfp4_seconds(uintptr_t x, uintptr_t codes, uintptr_t block_scales, uintptr_t out, int rows,
                          int n, int k, int copies, int reps, bool fast);
void convert_to_bf16(uintptr_t src, int src_dtype, uintptr_t dst, int64_t count);
// The mixture-of-experts block as Model::moe_block runs it, on rows x [rows, hidden] that are
// already normalized: router (its rows, then the shared expert's gate row where shared_inter > 0),
// top-k, the experts by `path` ("gemv", "tiled" (NVFP4: 8-row tiles of one expert) or "grouped"; split: the exact precision's hi + lo
// products), the shared expert, and the weighted sum added into resid [rows, hidden]. Pointers of
// an expert set: gate_up, down and, NVFP4, their block scales and per-expert global scales [experts].
struct MoeExpertPointers {
  uintptr_t gate_up = 0, down = 0, gate_up_block_scales = 0, down_block_scales = 0,
            gate_up_scales = 0, down_scales = 0;
};
struct MoeCheck {
  std::string path;
  uintptr_t x = 0, resid = 0, router = 0;
  int rows = 0, hidden = 0, experts = 0, top_k = 0, inter = 0, shared_inter = 0;
  bool normalize = false, split = false, nvfp4 = false;
  MoeExpertPointers routed, shared;
};
// The pairs' experts and weights the router chose, [rows * top_k] each.
std::pair<std::vector<int32_t>, std::vector<float>> moe_block(const MoeCheck& check);
// The fused decode route (launch_moe_route): resid [rows, hidden] and its sums of squares in
// norm_partials [rows, norm_count] -> xn (normalized rows) and the pairs' experts and weights.
std::pair<std::vector<int32_t>, std::vector<float>> moe_route(uintptr_t resid, uintptr_t norm_partials, int norm_count,
                                                              uintptr_t norm_weight, float eps, uintptr_t router,
                                                              int router_rows, int rows, int hidden, int experts,
                                                              int top_k, bool normalize, uintptr_t xn);
std::vector<int32_t> sample(uintptr_t logits, int rows, int vocab,
                            const std::vector<SampleRequest>& requests);

}  // namespace hearth::checks
