// The memory plan: every byte a resident model allocates on the GPU, computed from its config
// alone (pure host code, no device needed), before anything is allocated. Model allocates exactly
// these buffers; Python (engine/plan.py, through engine._native.plan_memory) shows the same plan
// before a load, so what the user is told is what the load takes.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "config.h"

namespace hearth {

// Teacher-forced scoring (all logits) runs in chunks of at most this many rows, so the logits
// buffer stays [512, vocab] whatever the prefill chunk.
constexpr int kScoreChunk = 512;
// Rows of one forward pass: a prompt chunk (at least a decode batch).
int forward_rows(const CacheConfig& cache);
// Rows of one scoring pass (all logits kept), what the logits buffer holds: kScoreChunk, but never
// fewer than a decode batch nor more than a forward pass.
int score_chunk_rows(const CacheConfig& cache);
// cuBLASLt's workspace (the largest its prefill algorithms ask for).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
// What the runtime allocates beyond our buffers at steady state (cuBLASLt handle and plans, graph
// executables, the sampler history): 3 MiB measured on an H200 for the 135M, 1B and 8B shapes
// (2026-12-03, tests/cuda/test_memory_plan_cuda.py), rounded up.
constexpr size_t kRuntimeOverheadBytes = size_t(4) << 20;

// Bytes of the resident weights, as ModelWeights lays them out: each piece 256-byte aligned;
// a 16-bit matrix n * k * 2 bytes, an NVFP4 projection its codes (n * k / 2) then its block
// scales (n * k / 16).
constexpr size_t kWeightAlign = 256;
size_t weight_piece_bytes(size_t bytes);
size_t projection_bytes(const ModelConfig& config, size_t n, size_t k);
size_t weight_bytes(const ModelConfig& config);
// A layer's experts stacked (16-bit, or NVFP4 codes, block scales and one fp32 global scale per
// expert), and the router's rows (the experts', then the shared expert's gate where there is one).
size_t expert_stack_bytes(const ModelConfig& config, size_t experts, size_t n, size_t k);
size_t moe_router_rows(const ModelConfig& config);
// The largest layer projection (n * k); NVFP4 expands one at a time for the tensor-core product.
size_t largest_projection(const ModelConfig& config);

struct MemoryPlan {
  size_t weight_bytes = 0;
  int kv_blocks = 0;          // the pool's blocks (one more, the padding rows' block, is allocated)
  size_t kv_block_bytes = 0;  // K and V of block_size tokens over all layers
  size_t kv_bytes = 0;
  // The workspace of a forward pass, part by part (name, bytes, each 256-byte aligned), in the
  // order Model lays them out.
  std::vector<std::pair<std::string, size_t>> workspace;
  size_t workspace_bytes = 0;
  // Allocated outside our buffers: cuBLASLt's handle and plans, the decode graphs' executables,
  // the sampler's history, the load's staging ring (freed after the load). An estimate,
  // measured on an H200 (docs/BENCHMARKS.md, "memory plan").
  size_t runtime_bytes = 0;
  size_t total_bytes() const { return weight_bytes + kv_bytes + workspace_bytes + runtime_bytes; }
};

MemoryPlan plan_memory(const ModelConfig& config, const CacheConfig& cache);

// Bytes per workspace part (a view of plan.workspace by name; 0 when absent).
size_t plan_part(const MemoryPlan& plan, const std::string& name);

}  // namespace hearth
