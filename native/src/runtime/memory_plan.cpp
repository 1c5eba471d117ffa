// The memory plan (memory_plan.h). Weights in elements of 2 bytes (bf16 or fp16), each piece
// aligned to 128 elements; workspace parts 256-byte aligned; the KV pool from the block count.
#include "memory_plan.h"

#include <algorithm>
#include <stdexcept>

#include "../kernels/gemv_params.cuh"
#include "../kernels/kernels.h"

namespace hearth {

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

size_t weight_piece_bytes(size_t bytes) { return align_up(bytes, kWeightAlign); }

size_t projection_bytes(const ModelConfig& c, size_t n, size_t k) {
  if (c.nvfp4) return weight_piece_bytes(n * k / 2) + weight_piece_bytes(n * k / 16);
  return weight_piece_bytes(n * k * 2);
}

size_t expert_stack_bytes(const ModelConfig& c, size_t experts, size_t n, size_t k) {
  if (c.nvfp4)
    return weight_piece_bytes(experts * n * k / 2) + weight_piece_bytes(experts * n * k / 16) +
           weight_piece_bytes(experts * 4);
  return weight_piece_bytes(experts * n * k * 2);
}

size_t moe_router_rows(const ModelConfig& c) { return c.moe_experts + (c.moe_shared_inter > 0 ? 1 : 0); }

size_t weight_bytes(const ModelConfig& c) {
  const size_t H = c.hidden, I = c.intermediate, V = c.vocab, hd = c.head_dim;
  const size_t q = (size_t)c.heads * hd, kv = (size_t)c.kv_heads * hd, qkv = q + 2 * kv;
  auto a = [](size_t elements) { return weight_piece_bytes(elements * 2); };  // 16-bit pieces
  const size_t qk_norms = !c.qk_norm ? 0 : c.qk_norm_whole ? a(q) + a(kv) : 2 * a(hd);
  const size_t attention = a(H) + projection_bytes(c, qkv, H) + (c.qkv_bias ? a(qkv) : 0) + qk_norms +
                           projection_bytes(c, H, q);
  const size_t dense_ffn = a(H) + projection_bytes(c, 2 * I, H) + projection_bytes(c, H, I);
  size_t moe_ffn = 0;
  if (c.moe_experts > 0) {
    const size_t E = c.moe_experts, Ie = c.moe_inter, S = c.moe_shared_inter;
    moe_ffn = a(H) + a(moe_router_rows(c) * H) + expert_stack_bytes(c, E, 2 * Ie, H) +
              expert_stack_bytes(c, E, H, Ie) +
              (S > 0 ? expert_stack_bytes(c, 1, 2 * S, H) + expert_stack_bytes(c, 1, H, S) : 0);
  }
  size_t layers = 0;
  for (int l = 0; l < c.layers; ++l) layers += attention + (c.routes(l) ? moe_ffn : dense_ffn);
  return a(V * H) + a(H) + (c.tied_embeddings ? 0 : a(V * H)) + layers;
}

size_t largest_projection(const ModelConfig& c) {
  const size_t H = c.hidden, I = c.intermediate, hd = c.head_dim;
  const size_t q = (size_t)c.heads * hd, qkv = q + 2 * (size_t)c.kv_heads * hd;
  const size_t dense = c.has_dense_layers() ? std::max(2 * I * H, H * I) : 0;  // experts never expand
  return std::max({qkv * H, H * q, dense});
}

int forward_rows(const CacheConfig& cache) { return std::max(cache.chunk_tokens, cache.max_batch); }

int score_chunk_rows(const CacheConfig& cache) {
  return std::max(cache.max_batch, std::min(forward_rows(cache), kScoreChunk));
}

MemoryPlan plan_memory(const ModelConfig& c, const CacheConfig& cache) {
  if (c.layers <= 0 || c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 ||
      c.intermediate <= 0 || c.vocab <= 0 || cache.max_sequence_blocks <= 0 || cache.block_size <= 0 ||
      cache.max_batch <= 0)
    throw std::invalid_argument("memory plan: sizes must be positive");
  MemoryPlan plan;
  const size_t H = c.hidden, I = c.intermediate, V = c.vocab, L = c.layers, hd = c.head_dim;
  const size_t q = (size_t)c.heads * hd, kv = (size_t)c.kv_heads * hd, qkv = q + 2 * kv;
  plan.weight_bytes = weight_bytes(c);
  const bool dense_layers = c.has_dense_layers();
  if (c.nvfp4 && (H % 32 != 0 || (dense_layers && I % 32 != 0) || q % 32 != 0))
    throw std::invalid_argument("NVFP4 projections need hidden, intermediate and query sizes that are multiples of 32");
  const bool moe = c.moe_experts > 0;
  if (moe) {
    if ((int)c.moe_layers.size() != c.layers)
      throw std::invalid_argument("mixture of experts: moe_layers must name every layer");
    if (c.moe_top_k < 1 || c.moe_top_k > std::min(32, c.moe_experts))
      throw std::invalid_argument("mixture of experts: top_k must be between 1 and min(32, experts)");
    if (c.moe_experts > 4096 || c.moe_inter <= 0 || !moe_shape_supported(c.hidden, c.moe_inter) ||
        (c.moe_shared_inter > 0 && !moe_shape_supported(c.hidden, c.moe_shared_inter)))
      throw std::invalid_argument("mixture of experts: hidden and expert sizes must be multiples of 16 "
                                  "(at most 4096 experts)");
  }

  const size_t C = forward_rows(cache), B = cache.max_batch;
  const bool fast = c.precision == Precision::Fast;
  const size_t part_rows = std::max<size_t>(B * 32, 1024);  // decode and prefill key-split partials
  const size_t dense_I = dense_layers ? I : 0;  // a model whose every layer routes has no dense MLP
  const size_t xn_width = std::max({H, q, dense_I});
  auto add = [&](const char* name, size_t bytes) {
    bytes = align_up(bytes, 256);
    plan.workspace.emplace_back(name, bytes);
    plan.workspace_bytes += bytes;
  };
  add("residual", C * H * 4);
  add("delta", C * H * 4);
  add("activations", C * xn_width * 4);
  add("qkv", C * qkv * 4);
  add("queries", C * q * 4);
  add("gate_up", C * 2 * dense_I * 4);
  add("logits", (size_t)score_chunk_rows(cache) * V * 4);
  add("attention_partials_ml", part_rows * c.heads * 2 * 4);
  add("attention_partials_acc", part_rows * c.heads * hd * 4);
  add("sampler", B * V * 4);
  add("rope_frequencies", hd / 2 * 4);
  add("sampler_rows", B * sizeof(SampleRow));
  add("tokens", B * 4);
  add("step_metadata", (5 * C + B * (size_t)cache.max_sequence_blocks) * 4);
  add("cublaslt", kLtWorkspaceBytes);
  add("operand_split", fast ? 0 : 2 * C * xn_width * 2);  // exact: bf16 hi + lo
  add("operand_fp16", fast ? C * xn_width * 2 : 0);       // fast: the fp16 operand
  add("operand_row_scales", C * 4);
  add("attention_counters", B * c.heads * 4);
  add("norm_partials", (size_t)kGemvMaxRows * H * 4);
  // NVFP4: one projection at a time expanded into 16 bits for the tensor-core product.
  add("nvfp4_expanded", c.nvfp4 ? largest_projection(c) * 2 : 0);
  // NVFP4, fast, GEMV rows: the SwiGLU GEMV's per-block max |y| of each row, the down GEMV's scale.
  size_t swiglu_blocks = 0;
  for (int r = 1; r <= kGemvMaxRows; ++r) swiglu_blocks = std::max(swiglu_blocks, (size_t)gemv_nvfp4_blocks(r, (int)(2 * I)));
  add("gemv_amax", c.nvfp4 && fast && dense_layers ? kGemvMaxRows * swiglu_blocks * 4 : 0);
  // Mixture of experts (moe.cu): router logits, the (row, expert) pairs, the experts' SwiGLU
  // activations and outputs per pair, the shared expert's outputs, the sort and its tiles.
  const size_t E = c.moe_experts, P = moe ? C * c.moe_top_k : 0, S = c.moe_shared_inter;
  add("moe_logits", moe ? C * moe_router_rows(c) * 4 : 0);
  add("moe_pair_experts", P * 4);
  add("moe_pair_weights", P * 4);
  add("moe_activations", std::max(P * c.moe_inter, moe ? C * S : 0) * 4);
  add("moe_outputs", P * H * 4);
  add("moe_shared_outputs", moe && S > 0 ? C * H * 4 : 0);
  add("moe_sorted_pairs", P * 4);
  // The grouped GEMM's 64-row tiles, or (up to kMoeTiledMaxRows tokens) the expert GEMV's 8-row ones.
  const size_t tiles = std::max(moe_max_tiles((int)P, (int)E, kMoeTileRows),
                                moe_max_tiles((int)std::min<size_t>(P, (size_t)kMoeTiledMaxRows * c.moe_top_k), (int)E,
                                              kMoeGemvTileRows));
  add("moe_tiles", moe ? (1 + 3 * tiles) * 4 : 0);
  add("moe_counters", moe ? C * 4 : 0);  // the fused route kernel's, one per row

  plan.kv_block_bytes = 2 * L * (size_t)cache.block_size * kv * 2;
  plan.kv_blocks = cache.block_count > 0 ? cache.block_count
                                         : cache.max_batch * cache.max_sequence_blocks;
  plan.kv_bytes = (size_t)(plan.kv_blocks + 1) * plan.kv_block_bytes;
  plan.runtime_bytes = kRuntimeOverheadBytes;
  return plan;
}

size_t plan_part(const MemoryPlan& plan, const std::string& name) {
  for (const auto& p : plan.workspace)
    if (p.first == name) return p.second;
  return 0;
}

}  // namespace hearth
