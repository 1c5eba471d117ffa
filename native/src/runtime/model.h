// One resident decoder model on the GPU: its weights (q/k/v and gate/up fused, in the precision's
// format), the paged KV cache of every sequence, the workspace of a forward pass, the decode CUDA
// graphs and the device sampler. The Python runner (engine/backends/cuda_native.py) drives it;
// every method here may block on the GPU and is called with the GIL released.
//
// Where things are: memory_plan.cpp sizes every buffer (the one plan Python shows before a load);
// weights.cpp loads checkpoint tensors into their slots and converts them to the resident format;
// forward.cpp is the layer pipeline (attention block, feed-forward block, projections that pick
// their kernel by row count); decode_graphs.cpp captures and replays the decode buckets; this
// file's model.cpp holds the sequence and sampling API.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/kernels.h"
#include "device_memory.h"
#include "kv_pool.h"
#include "memory_plan.h"
#include "weights.h"

namespace hearth {

struct SampleRequest {
  float temperature = 1.f, top_p = 1.f, min_p = 0.f, repetition_penalty = 1.f;
  int top_k = 0;
  uint64_t seed = 0;
  int64_t step = 0;
  std::vector<int32_t> history;
  std::vector<uint32_t> mask;  // structured output: ceil(vocab / 32) words of allowed tokens, or empty
};

struct MemoryReport {
  size_t weight_bytes, kv_bytes, workspace_bytes;
  int free_blocks, total_blocks, block_size, sequences;
  std::string gemm_backend, precision;
};

std::vector<float> rope_inv_freq(const ModelConfig& config);  // with linear / Llama-3 scaling
double step_uniform(uint64_t seed, int64_t step);  // engine/sampling.py's splitmix64 draw

// Device sampler parameters per row and the flat list they point into: each row's distinct
// penalized ids, then its token mask's words (where it has one).
void build_sample_rows(const std::vector<SampleRequest>& rows, int vocab,
                       std::vector<SampleRow>* params, std::vector<int32_t>* history);

class Model {
 public:
  Model(const ModelConfig& config, const CacheConfig& cache);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Copy one checkpoint tensor (file, byte offset and size, dtype 0 bf16 / 1 fp16 / 2 fp32) into
  // its slot at element offset `elem_offset`.
  void load_tensor(Slot slot, int layer, const std::string& path, int64_t file_offset,
                   int64_t nbytes, int dtype, int64_t elem_offset, int64_t numel);
  // An NVFP4 layer projection (config.nvfp4), whole: codes [n, k/2] and e4m3 block scales
  // [n, k/16] from host memory, and its fp32 global scale (fused parts already share one).
  void load_nvfp4(Slot slot, int layer, const uint8_t* codes, int64_t code_bytes,
                  const uint8_t* block_scales, int64_t scale_bytes, float global_scale);
  // One expert's NVFP4 projection (slot MoeGateUp / MoeDown, or the shared expert's with expert 0):
  // its codes, block scales and global scale (gate and up already on one).
  void load_nvfp4_expert(Slot slot, int layer, int expert, const uint8_t* codes, int64_t code_bytes,
                         const uint8_t* block_scales, int64_t scale_bytes, float global_scale);
  // Converts the weights to the resident format, frees the staging buffers, captures the decode
  // graphs (unless HEARTH_CUDA_GRAPHS=0) and synchronizes.
  void finish_load();

  int allocate_sequence();
  void release_sequence(int seq);
  int length(int seq) const;
  void truncate(int seq, int length);

  // Append tokens; logits of the last one (or of all, into `all_logits` [n, vocab]) are kept.
  void prefill(int seq, const std::vector<int32_t>& tokens, float* all_logits);
  // One token per sequence. Where decode graphs were captured, the step is padded to the next
  // bucket (1, 2, 4, ..., max_batch) and replayed as one CUDA graph.
  void decode(const std::vector<int>& seqs, const std::vector<int32_t>& tokens);
  std::vector<int32_t> sample(const std::vector<SampleRequest>& rows);
  // decode + sample in one call: one graph replay, the sampler, one token id per sequence back.
  std::vector<int32_t> decode_sample(const std::vector<int>& seqs, const std::vector<int32_t>& tokens,
                                     const std::vector<SampleRequest>& rows);
  // Capture the decode step of every bucket as a CUDA graph and replay each once (warm-up);
  // idempotent.
  void capture_decode_graphs();
  std::vector<int> graph_buckets() const;  // the captured bucket sizes
  int logits_rows() const { return logits_rows_; }
  void copy_logits(float* host) const;  // [logits_rows, vocab]
  MemoryReport memory() const;
  const ModelConfig& config() const { return cfg_; }

 private:
  struct Step {  // one forward pass's token metadata, built on the host
    std::vector<int32_t> ids, positions, slots, kv_lens, row_table, tables;
    int table_stride = 1;
    int max_kv_len = 0;
  };
  struct DecodeGraph {
    int rows = 0;
    cudaGraphExec_t exec = nullptr;
  };
  // forward.cpp: the pipeline.
  struct Pass;
  struct Residual;
  struct Activation;
  struct RopeEpilogue;
  void forward(const Step& step, bool decode_mode, int logit_first, int logit_count);
  // Copies the step's metadata to meta_ (ids, positions, slots, kv_lens, row_table: T each, then
  // the tables at row stride table_stride); only the first `step.table_stride` ints of each table
  // row travel when `device_stride` is larger.
  void upload_meta(const Step& step, int device_stride);
  // The kernels of one forward pass over T rows whose metadata is in meta_ (graph-capturable:
  // no host synchronization, no allocation).
  void run_layers(int T, int table_stride, bool decode_mode, int logit_first, int logit_count);
  void attention_block(const Pass& pass, Residual& res, int layer);
  void feed_forward_block(const Pass& pass, Residual& res, int layer);
  // A routing layer's feed-forward (moe.cu): norm, router, top-k, the chosen experts (GEMVs for
  // few rows, the sorted grouped GEMM for many), the shared expert, the weighted sum into the
  // residual stream.
  void moe_block(const Pass& pass, Residual& res, int layer);
  // One expert set's two products for `pairs` (row, expert) pairs into `y` (pair_expert nullptr:
  // the shared expert, one pair per row). x16: the normalized rows / x_scale as fp16 (prompts at
  // the fast precision), for NVFP4 experts' grouped product; else null.
  void run_experts(const Pass& pass, const MoeExperts& ex, const int32_t* pair_expert, int pairs,
                   int top_k, float* y, const f16* x16 = nullptr, float x_scale = 1.f);
  // A projection of the normalized residual stream (the norm prologue); rows [row0, row0 + rows).
  // `rope` (qkv): bias, q/k norms and rope + KV write follow; `swiglu` (gate/up): the result is
  // the SwiGLU activation, returned as the next projection's input.
  Activation project_normed(const Pass& pass, Residual& res, const bf16* norm_weight,
                            float norm_scale, const Linear& proj, float* out, int row0, int rows,
                            const RopeEpilogue* rope, bool swiglu);
  // A projection whose output is added into the residual stream (o, down).
  void project_into_residual(const Pass& pass, Residual& res, const Linear& proj,
                             const Activation& in);
  // The weight as the tensor-core product takes it: itself, or an NVFP4 weight expanded into
  // nvfp4_expanded_ (fp16 for fast, bf16 for exact) with its global scale.
  WeightView gemm_weight(const Pass& pass, const Linear& proj);
  // The fast precision's product of many rows: cuBLASLt over the 16-bit weight, or an NVFP4 weight
  // read in place up to kGemmNvfp4MaxRows rows.
  void product_fast(const Pass& pass, const Fp16Operand& x, const Linear& proj, float* out, int rows);

  void allocate();  // the plan's buffers and the workspace views

  // decode_graphs.cpp
  Step decode_step(const std::vector<int>& seqs, const std::vector<int32_t>& tokens, int rows);
  int bucket_for(int rows) const;
  void check_tokens(const std::vector<int32_t>& tokens) const;

  ModelConfig cfg_;
  CacheConfig cache_;
  MemoryPlan plan_;
  int q_size_, kv_size_, qkv_size_, chunk_;
  int part_rows_ = 0;  // (row x split) pairs the attention partial buffers hold
  static constexpr int kMaxSplits = 32;
  // Up to kGemvNormMaxRows rows RMSNorm lives in the GEMVs (o / down add into the residual stream
  // and leave its sums of squares; qkv / gate-up / lm_head normalize on the fly) and rope in the
  // qkv GEMV. At 8 rows the norm prologue cost the 135M 17 % of its b8 decode, so 5-8 rows use the
  // RMSNorm kernel and plain GEMVs; more rows the tensor-core product.
  static constexpr int kGemvNormMaxRows = 4;
  int step_max_kv_ = 0;  // the forward pass's largest kv_len (host side)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t meta_done_ = nullptr;

  DeviceBuffer kv_, workspace_, history_;
  ModelWeights weights_;
  std::unique_ptr<WeightLoader> loader_;
  std::unique_ptr<KvPool> pool_;
  int dummy_block_ = 0;  // one KV block past the pool: padded decode rows write and read only it
  std::vector<DecodeGraph> graphs_;
  size_t kv_layer_elems_ = 0;  // per layer, per k or v

  // workspace views (memory_plan.h lists them)
  float *resid_, *delta_, *qkv_, *q_, *gate_up_, *logits_, *part_ml_, *part_acc_, *sample_work_,
      *inv_freq_, *xn_, *row_scale_, *norm_parts_;
  bf16* split_;
  f16* op16_;
  void* nvfp4_expanded_;  // one projection's 16-bit expansion (NVFP4 models only)
  // mixture of experts (memory_plan.cpp lists them; null for dense models)
  float *moe_logits_ = nullptr, *moe_pair_weights_ = nullptr, *moe_act_ = nullptr, *moe_y_ = nullptr,
        *moe_shared_y_ = nullptr;
  int32_t *moe_pair_experts_ = nullptr, *moe_sorted_ = nullptr, *moe_tiles_ = nullptr;
  int* moe_counters_ = nullptr;  // the fused route kernel's per-row counters, left zero
  int* attn_counters_;  // decode attention's per (row, head) piece counters, left zero
  float* gemv_amax_ = nullptr;    // the fast SwiGLU GEMV's per-block row max |y| (NVFP4, fast)
  int32_t *meta_, *tokens_;
  SampleRow* sample_params_;
  void* lt_workspace_;
  size_t meta_ints_ = 0;
  PinnedBuffer meta_host_, token_host_;
  int logits_rows_ = 0;
};

}  // namespace hearth
