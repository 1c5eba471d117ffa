// What a model is (ModelConfig: the checkpoint's decoder shape) and how it runs (CacheConfig: KV
// pool, batch, chunk; Precision). Plain data, filled from Python (bindings.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hearth {

// How the projections compute (a load option; docs/ARCHITECTURE.md):
//  - Fast (default): scaled fp16 weights and activations, one tensor-core product per projection,
//    fp32 accumulation; decode GEMVs compute in fp32 over the fp16 weights.
//  - Exact: bf16 weights, fp32 activations split into bf16 hi + lo, two products (fp32-accurate
//    activations; the reference the fast path is measured against).
enum class Precision { Fast, Exact };

struct ModelConfig {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float rms_eps = 1e-6f;
  double rope_theta = 10000.0;
  std::string rope_type = "default";  // default | linear | llama3
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_positions = 8192;
  bool tied_embeddings = false, qkv_bias = false, qk_norm = false;
  Precision precision = Precision::Fast;
  // The layer projections (q/k/v, o, gate/up, down) are NVFP4 (weight-only: codes and scales stay
  // packed on the GPU); the embedding, lm_head and norms stay 16-bit.
  bool nvfp4 = false;
  // OLMoE: the q / k norms span the whole projection (weights [q size] and [kv size]), not a head.
  bool qk_norm_whole = false;
  // Mixture of experts (engine/moe.py): layer l routes when moe_layers[l] (the others are dense
  // SwiGLU MLPs of `intermediate`); moe_experts experts of moe_inter, moe_top_k per token, their
  // weights renormalised when moe_normalize; a sigmoid-gated shared expert of moe_shared_inter
  // (Qwen2-MoE) where > 0. Experts are bf16 in both precisions, NVFP4 with `nvfp4`.
  int moe_experts = 0, moe_top_k = 0, moe_inter = 0, moe_shared_inter = 0;
  bool moe_normalize = false;
  std::vector<uint8_t> moe_layers;
  bool routes(int layer) const {
    return moe_experts > 0 && layer < (int)moe_layers.size() && moe_layers[layer];
  }
  bool has_dense_layers() const {
    for (int l = 0; l < layers; ++l)
      if (!routes(l)) return true;
    return false;
  }
};

struct CacheConfig {
  int block_size = 16;
  int block_count = 0;            // KV blocks of the pool (the engine passes the memory plan's); 0: a full context per batch row
  int max_sequence_blocks = 0;    // context_length / block_size, rounded up
  int max_batch = 8;
  int chunk_tokens = 2048;        // prompt tokens per forward pass
};

}  // namespace hearth
