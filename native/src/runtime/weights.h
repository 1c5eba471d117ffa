// The resident weights: where each checkpoint tensor goes (Slot), the projections as Linear ops
// over their resident format, and the loader that streams tensors from files into them.
//
// A projection (Linear) owns its weight format: the loader writes every 16-bit tensor as bf16; for
// the fast precision finish() then turns each projection's weight into fp16 times a power of two
// (its largest magnitude into [2^14, 2^15)), in place. NVFP4 projections (config.nvfp4) arrive
// packed (load_nvfp4: codes, block scales, global scale) and stay so; their kernels are picked by
// format (gemv.cu reads them directly, nvfp4.cu expands one at a time for the tensor-core product).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../kernels/kernels.h"
#include "config.h"
#include "device_memory.h"
#include "read_pool.h"

namespace hearth {

// Where a checkpoint tensor goes.
// Mixture-of-experts layers (ModelConfig::routes) hold MoeRouter [experts, hidden] (and
// MoeSharedGate, the shared expert's [1, hidden] gate, as the router's last row), MoeGateUp
// [experts, 2 * moe_inter, hidden] (expert e's gate rows then its up rows), MoeDown [experts,
// hidden, moe_inter], and the shared expert's MoeSharedGateUp / MoeSharedDown, instead of Wgu / Wdown.
enum class Slot { Embed, FinalNorm, LmHead, AttnNorm, Wqkv, Bqkv, QNorm, KNorm, Wo, MlpNorm, Wgu, Wdown,
                  MoeRouter, MoeSharedGate, MoeGateUp, MoeDown, MoeSharedGateUp, MoeSharedDown };

// One projection: out[r, n] = x[r, k] @ w[n, k]^T.
struct Linear {
  WeightView w;
  int n = 0, k = 0;
};

struct LayerWeights {
  const bf16 *attn_norm = nullptr, *bqkv = nullptr, *q_norm = nullptr, *k_norm = nullptr,
             *mlp_norm = nullptr;
  Linear qkv, o, gate_up, down;  // gate_up: [gate rows; up rows] (empty where the layer routes)
  // Where the layer routes: the router rows (bf16, both precisions), the experts, the shared expert.
  const bf16* router = nullptr;
  MoeExperts experts, shared;
  // The fast operand's static scale after each norm (a normalized row is bounded by
  // sqrt(hidden) * max |norm weight|).
  float attn_norm_scale = 1.f, mlp_norm_scale = 1.f;
};

struct ModelWeights {
  DeviceBuffer buffer;  // every tensor, plan_memory's weight_bytes
  Linear embed;         // [vocab, hidden]: the table (and the lm_head where tied)
  Linear lm_head;
  const bf16* final_norm = nullptr;
  float final_norm_scale = 1.f;
  std::vector<LayerWeights> layers;

  // Allocates and lays out the tensors of `config` (formats bf16 until finish()).
  void allocate(const ModelConfig& config);
  // Where the 16-bit tensor `slot` of `layer` lies, and its element count.
  uint16_t* slot(const ModelConfig& config, Slot slot, int layer, int64_t* numel);
  // The layer projection `slot` (Wqkv, Wo, Wgu, Wdown) of `layer`.
  Linear& projection(Slot slot, int layer);
  // Expert `expert`'s part of an NVFP4 expert slot (MoeGateUp / MoeDown; the shared expert's
  // slots take expert 0): where its codes, block scales and global scale go, and their sizes.
  struct ExpertPart {
    uint8_t *codes, *block_scales;
    float* global_scale;
    int64_t code_bytes, scale_bytes;
  };
  ExpertPart expert_part(Slot slot, int layer, int expert);
  // After every tensor landed (stream-ordered): the fast precision's conversion and scales.
  void finish(const ModelConfig& config, cudaStream_t stream);
};

// Streams checkpoint tensors into device memory: files opened once, chunks read by a ReadPool of
// threads into a ring of pinned buffers, copied (and fp16 / fp32 converted to bf16) on `stream`,
// each ring slot reused after its event; no host synchronization until the caller's.
class WeightLoader {
 public:
  explicit WeightLoader(cudaStream_t stream);
  ~WeightLoader();
  WeightLoader(const WeightLoader&) = delete;
  WeightLoader& operator=(const WeightLoader&) = delete;
  void load(uint16_t* dest, const std::string& path, int64_t file_offset, int64_t nbytes, int dtype,
            int64_t numel);

 private:
  static constexpr int kRing = 4;
  static constexpr size_t kStagingBytes = size_t(32) << 20;
  cudaStream_t stream_;
  std::unique_ptr<ReadPool> readers_;
  std::unordered_map<std::string, int> files_;
  PinnedBuffer ring_[kRing];
  DeviceBuffer ring_scratch_[kRing];
  cudaEvent_t ring_done_[kRing] = {};
  int ring_next_ = 0;
};

}  // namespace hearth
