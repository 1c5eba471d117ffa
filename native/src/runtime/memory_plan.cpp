// The memory plan (memory_plan.h). Weights in elements of 2 bytes (bf16 or fp16), each piece
// aligned to 128 elements; workspace parts 256-byte aligned; the KV pool from the block count.
#include "memory_plan.h"

#include <algorithm>
#include <stdexcept>

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

size_t weight_bytes(const ModelConfig& c) {
  const size_t H = c.hidden, I = c.intermediate, V = c.vocab, L = c.layers, hd = c.head_dim;
  const size_t q = (size_t)c.heads * hd, kv = (size_t)c.kv_heads * hd, qkv = q + 2 * kv;
  auto a = [](size_t elements) { return weight_piece_bytes(elements * 2); };  // 16-bit pieces
  const size_t layer = a(H) + projection_bytes(c, qkv, H) + (c.qkv_bias ? a(qkv) : 0) +
                       (c.qk_norm ? 2 * a(hd) : 0) + projection_bytes(c, H, q) + a(H) +
                       projection_bytes(c, 2 * I, H) + projection_bytes(c, H, I);
  return a(V * H) + a(H) + (c.tied_embeddings ? 0 : a(V * H)) + L * layer;
}

size_t largest_projection(const ModelConfig& c) {
  const size_t H = c.hidden, I = c.intermediate, hd = c.head_dim;
  const size_t q = (size_t)c.heads * hd, qkv = q + 2 * (size_t)c.kv_heads * hd;
  return std::max({qkv * H, H * q, 2 * I * H, H * I});
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
  if (c.nvfp4 && (H % 32 != 0 || I % 32 != 0 || q % 32 != 0))
    throw std::invalid_argument("NVFP4 projections need hidden, intermediate and query sizes that are multiples of 32");

  const size_t C = std::max(cache.chunk_tokens, cache.max_batch), B = cache.max_batch;
  const bool fast = c.precision == Precision::Fast;
  const size_t part_rows = std::max<size_t>(B * 32, 1024);  // decode and prefill key-split partials
  const size_t xn_width = std::max({H, q, I});
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
  add("gate_up", C * 2 * I * 4);
  add("logits", std::max<size_t>(B, std::min<size_t>(C, kScoreChunk)) * V * 4);
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
