// One resident decoder model on the GPU: its weights (bf16, q/k/v and gate/up fused), the paged KV
// cache of every sequence, the workspace of a forward pass, and the device sampler. The Python
// runner (engine/backends/cuda_native.py) drives it; every method here may block on the GPU and is
// called with the GIL released.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../kernels/kernels.h"
#include "device_memory.h"
#include "kv_pool.h"
#include "read_pool.h"

namespace hearth {

struct ModelConfig {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  float rms_eps = 1e-6f;
  double rope_theta = 10000.0;
  std::string rope_type = "default";  // default | linear | llama3
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_positions = 8192;
  bool tied_embeddings = false, qkv_bias = false, qk_norm = false;
};

struct CacheConfig {
  int block_size = 16;
  int block_count = 0;            // 0: sized from free memory
  int max_sequence_blocks = 0;    // context_length / block_size, rounded up
  int max_batch = 8;
  int chunk_tokens = 512;         // prompt tokens per forward pass
  size_t reserve_bytes = size_t(1) << 30;  // left free for others when sizing from free memory
};

// Where a checkpoint tensor goes.
enum class Slot { Embed, FinalNorm, LmHead, AttnNorm, Wqkv, Bqkv, QNorm, KNorm, Wo, MlpNorm, Wgu, Wdown };

struct SampleRequest {
  float temperature = 1.f, top_p = 1.f, min_p = 0.f, repetition_penalty = 1.f;
  int top_k = 0;
  uint64_t seed = 0;
  int64_t step = 0;
  std::vector<int32_t> history;
};

struct MemoryReport {
  size_t weight_bytes, kv_bytes, workspace_bytes;
  int free_blocks, total_blocks, block_size, sequences;
  std::string gemm_backend;
};

std::vector<float> rope_inv_freq(const ModelConfig& config);  // with linear / Llama-3 scaling
double step_uniform(uint64_t seed, int64_t step);  // engine/sampling.py's splitmix64 draw

// Device sampler parameters per row and the flat list of distinct penalized ids they point into.
void build_sample_rows(const std::vector<SampleRequest>& rows, int vocab,
                       std::vector<SampleRow>* params, std::vector<int32_t>* history);

class Model {
 public:
  Model(const ModelConfig& config, const CacheConfig& cache);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Copy one checkpoint tensor (memory-mapped file, byte offset and size, dtype 0 bf16 / 1 fp16 /
  // 2 fp32) into its slot at element offset `elem_offset`, through pinned staging buffers.
  void load_tensor(Slot slot, int layer, const std::string& path, int64_t file_offset,
                   int64_t nbytes, int dtype, int64_t elem_offset, int64_t numel);
  void finish_load();  // unmaps files, frees staging, synchronizes

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
  // Capture the decode step of every bucket as a CUDA graph and replay each once (warm-up).
  // Called by finish_load unless HEARTH_CUDA_GRAPHS=0; idempotent.
  void capture_decode_graphs();
  std::vector<int> graph_buckets() const;  // the captured bucket sizes
  int logits_rows() const { return logits_rows_; }
  void copy_logits(float* host) const;  // [logits_rows, vocab]
  MemoryReport memory() const;
  const ModelConfig& config() const { return cfg_; }

 private:
  struct LayerWeights {
    bf16 *attn_norm, *wqkv, *bqkv, *q_norm, *k_norm, *wo, *mlp_norm, *wgu, *wdown;
  };
  struct Step {  // one forward pass's token metadata, built on the host
    std::vector<int32_t> ids, positions, slots, kv_lens, row_table, tables;
    int table_stride = 1;
    int max_kv_len = 0;
  };
  struct DecodeGraph {
    int rows = 0;
    cudaGraphExec_t exec = nullptr;
  };
  void plan_memory();
  bf16* slot_pointer(Slot slot, int layer, int64_t* numel);
  void forward(const Step& step, bool decode_mode, int logit_first, int logit_count);
  // Copies the step's metadata to meta_ (ids, positions, slots, kv_lens, row_table: T each, then
  // the tables at row stride table_stride); only the first `step.table_stride` ints of each table
  // row travel when `device_stride` is larger.
  void upload_meta(const Step& step, int device_stride);
  // The kernels of one forward pass over T rows whose metadata is in meta_ (graph-capturable:
  // no host synchronization, no allocation). split_len 0 in decode mode: per row, on the device.
  void run_layers(int T, int table_stride, bool decode_mode, int logit_first, int logit_count);
  Step decode_step(const std::vector<int>& seqs, const std::vector<int32_t>& tokens, int rows);
  int bucket_for(int rows) const;
  void matmul(const float* x, const bf16* w, float* out, int rows, int n, int k);
  void check_tokens(const std::vector<int32_t>& tokens) const;

  ModelConfig cfg_;
  CacheConfig cache_;
  int q_size_, kv_size_, qkv_size_, chunk_;
  static constexpr int kMaxSplits = 32;
  // Decode steps of more than kGemvMaxRows rows (HEARTH_DECODE_GEMM, read at construction; graphs
  // capture the choice): stacked (default: hi and lo as one [2 rows, k] operand, each weight read
  // once, the same arithmetic as split), split (two products, each weight read twice), or bf16
  // (one product over bf16-rounded activations: 8B b64 4,556 -> 6,907 tok/s, but the 1B / 8B
  // teacher-forced bucket-32 rows miss the bar: 96.4 % top-1 / 2.6e-2).
  GemmActivations decode_gemm_ = GemmActivations::Stacked;
  float* stacked_ = nullptr;     // [2 * max_batch, widest n] fp32, where max_batch > kGemvMaxRows
  float* norm_parts_ = nullptr;  // [kGemvNormMaxRows, <= hidden] sums of squares of residual rows
  bool in_decode_ = false;
  // Gate/up GEMV with the SwiGLU epilogue at <= kGemvMaxRows rows (HEARTH_GEMV_SWIGLU=0: the
  // GEMV, then the swiglu kernel). Read at construction; graphs capture the choice.
  bool gemv_swiglu_ = true;
  // RMSNorm fused into the GEMVs at <= kGemvNormMaxRows rows (HEARTH_GEMV_NORM=0: the rmsnorm
  // kernels). At 8 rows the norm prologue cost the 135M 17 % of its b8 decode (bench --ab-each,
  // 2026-12-03; 8B unchanged), so 8-row steps use the norm kernels.
  static constexpr int kGemvNormMaxRows = 4;
  bool gemv_norm_ = true;
  // Stacked decode GEMM steps without the add-halves and split kernels: RMSNorm adds the halves of
  // the o / down products as it reads them and writes the next product's bf16 hi / lo operand,
  // SwiGLU likewise between gate/up and down (HEARTH_DECODE_GEMM_FUSE=0: separate kernels; read
  // at construction). The same bits either way.
  bool gemm_fuse_ = true;
  // Rope and the KV write in the qkv GEMV's epilogue where it normalizes (<= kGemvNormMaxRows
  // rows) and the model has no qkv bias or q / k norm (HEARTH_GEMV_ROPE=0: the rope kernel; read
  // at construction). The same bits either way.
  bool gemv_rope_ = true;
  // Prefill attention key split (flash-decoding style) for few query tiles over long history:
  // HEARTH_PREFILL_KSPLIT=0 turns it off (read per prefill forward). Partials share part_ml_ /
  // part_acc_ with decode.
  bool prefill_ksplit_ = true;
  int part_rows_ = 0;  // (row x split) pairs the partial buffers hold
  int step_max_kv_ = 0;  // the forward pass's largest kv_len (host side)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t meta_done_ = nullptr;

  DeviceBuffer weights_, kv_, workspace_, history_;
  std::unique_ptr<KvPool> pool_;
  int dummy_block_ = 0;  // one KV block past the pool: padded decode rows write and read only it
  std::vector<DecodeGraph> graphs_;
  bf16 *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  size_t kv_layer_elems_ = 0;  // per layer, per k or v

  // workspace views
  float *resid_, *delta_, *qkv_, *q_, *gate_up_, *logits_, *part_ml_, *part_acc_, *sample_work_,
      *inv_freq_;
  float* xn_;
  bf16* split_;
  int* attn_counters_;  // decode attention's per (row, head) piece counters, left zero
  int32_t *meta_, *tokens_;
  SampleRow* sample_params_;
  void* lt_workspace_;
  size_t lt_workspace_bytes_ = 32u << 20;
  size_t meta_ints_ = 0;
  PinnedBuffer meta_host_, token_host_;
  int logits_rows_ = 0;

  // loading
  struct Mapping {
    void* data;
    size_t size;
  };
  std::unordered_map<std::string, Mapping> maps_;
  PinnedBuffer staging_[2];
  DeviceBuffer scratch_[2];
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  size_t staging_bytes_ = 32u << 20;
  // Threaded loader (HEARTH_LOAD_THREADS, default min(8, cores); 1 = the mmap + memcpy path
  // above, one sync per tensor): files opened once, chunks pread by a ReadPool into a ring of
  // pinned buffers, H2D (and fp16/fp32 conversion) queued on stream_, each ring slot reused
  // after its event; no synchronization before finish_load.
  static constexpr int kRing = 4;
  int load_threads_ = 0;  // 0: not decided yet
  std::unique_ptr<ReadPool> readers_;
  std::unordered_map<std::string, int> files_;
  PinnedBuffer ring_[kRing];
  DeviceBuffer ring_scratch_[kRing];
  cudaEvent_t ring_done_[kRing] = {};
  int ring_next_ = 0;
  void load_tensor_threaded(bf16* dest, const std::string& path, int64_t file_offset,
                            int64_t nbytes, int dtype, int64_t numel);
  void release_loader();
};

}  // namespace hearth
