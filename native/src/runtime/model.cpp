// The resident model's construction (the memory plan's buffers), loading, sequences, prefill and
// sampling. The forward pass is in forward.cpp, decode steps and graphs in decode_graphs.cpp.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "../env.h"

namespace hearth {

// Inverse frequencies of the rotary embedding, with Llama-3 or linear scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float e = (float)(2 * i) / (float)c.head_dim;
    inv[i] = 1.0f / std::pow((float)c.rope_theta, e);
  }
  if (c.rope_type == "linear") {
    for (float& f : inv) f = (float)(f / c.rope_factor);
  } else if (c.rope_type == "llama3") {
    const double old_ctx = c.rope_original_max_positions;
    const double low_wavelen = old_ctx / c.rope_low_freq_factor;
    const double high_wavelen = old_ctx / c.rope_high_freq_factor;
    for (float& f : inv) {
      const double freq = f;
      const double wavelen = 2.0 * M_PI / freq;
      double out = wavelen > low_wavelen ? freq / c.rope_factor : freq;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (old_ctx / wavelen - c.rope_low_freq_factor) /
                              (c.rope_high_freq_factor - c.rope_low_freq_factor);
        out = (1.0 - smooth) * out / c.rope_factor + smooth * out;
      }
      f = (float)out;
    }
  } else if (c.rope_type != "default") {
    throw std::invalid_argument("unsupported rope scaling type: " + c.rope_type);
  }
  return inv;
}

double step_uniform(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)(step + 1) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) / (double)(1ull << 53);
}

void build_sample_rows(const std::vector<SampleRequest>& rows, int vocab,
                       std::vector<SampleRow>* params, std::vector<int32_t>* history) {
  params->assign(rows.size(), SampleRow{});
  history->clear();
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRequest& q = rows[r];
    SampleRow& p = (*params)[r];
    p.temperature = q.temperature;
    p.top_k = q.top_k;
    p.top_p = q.top_p;
    p.min_p = q.min_p;
    p.penalty = q.repetition_penalty;
    p.greedy = q.temperature == 0.f || q.top_k == 1;
    p.uniform = step_uniform(q.seed, q.step);
    p.hist_offset = (int)history->size();
    if (q.repetition_penalty != 1.f) {
      std::set<int32_t> seen;
      for (int32_t t : q.history)
        if (t >= 0 && t < vocab) seen.insert(t);
      history->insert(history->end(), seen.begin(), seen.end());
    }
    p.hist_count = (int)history->size() - p.hist_offset;
    p.mask_offset = -1;
    if (!q.mask.empty()) {
      HEARTH_REQUIRE(q.mask.size() == (size_t)(vocab + 31) / 32,
                     "sample: a token mask holds one bit per vocabulary entry (ceil(vocab / 32) words)");
      p.mask_offset = (int)history->size();
      for (uint32_t w : q.mask) history->push_back((int32_t)w);
    }
  }
}

Model::Model(const ModelConfig& config, const CacheConfig& cache) : cfg_(config), cache_(cache) {
  HEARTH_REQUIRE(cfg_.moe_experts == 0 || (int)cfg_.moe_layers.size() == cfg_.layers,
                 "model config: moe_layers must name every layer");
  HEARTH_REQUIRE(cfg_.layers > 0 && cfg_.hidden > 0 && cfg_.heads > 0 && cfg_.kv_heads > 0 &&
                 cfg_.head_dim > 0 && cfg_.intermediate > 0 && cfg_.vocab > 0,
                 "model config: sizes must be positive");
  HEARTH_REQUIRE(cfg_.heads % cfg_.kv_heads == 0, "model config: heads must be a multiple of kv_heads");
  HEARTH_REQUIRE(cfg_.head_dim == 32 || cfg_.head_dim == 64 || cfg_.head_dim == 96 || cfg_.head_dim == 128 ||
                 cfg_.head_dim == 256, "head_dim must be 32, 64, 96, 128 or 256");
  HEARTH_REQUIRE(cache_.max_sequence_blocks > 0 && cache_.block_size > 0 && cache_.max_batch > 0 &&
                 cache_.max_batch <= kGemvMaxRows * 64, "cache config: bad sizes");
  q_size_ = cfg_.heads * cfg_.head_dim;
  kv_size_ = cfg_.kv_heads * cfg_.head_dim;
  qkv_size_ = q_size_ + 2 * kv_size_;
  chunk_ = forward_rows(cache_);
  part_rows_ = std::max(cache_.max_batch * kMaxSplits, 1024);
  HEARTH_CUDA(cudaSetDevice(0));
  plan_ = plan_memory(cfg_, cache_);
  allocate();
}

// Exactly the plan's buffers (memory_plan.h), or a DeviceOutOfMemory naming the parts.
void Model::allocate() {
  const MemoryPlan& plan = plan_;
  size_t free_b = 0, total_b = 0;
  HEARTH_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t needed = plan.weight_bytes + plan.kv_bytes + plan.workspace_bytes;
  if (needed > free_b)
    throw DeviceOutOfMemory("not enough GPU memory to load this model: " + std::to_string(needed) +
                                " bytes needed (weights " + std::to_string(plan.weight_bytes) +
                                ", KV cache " + std::to_string(plan.kv_bytes) + ", workspace " +
                                std::to_string(plan.workspace_bytes) + "), " +
                                std::to_string(free_b) + " free",
                            needed, free_b);
  weights_.allocate(cfg_);
  kv_ = DeviceBuffer(plan.kv_bytes, "KV cache");
  workspace_ = DeviceBuffer(plan.workspace_bytes, "workspace");
  pool_ = std::make_unique<KvPool>(plan.kv_blocks, cache_.block_size, cache_.max_sequence_blocks);
  kv_layer_elems_ = (size_t)(plan.kv_blocks + 1) * cache_.block_size * kv_size_;
  dummy_block_ = plan.kv_blocks;

  char* p = workspace_.as<char>();
  auto part = [&](const char* name) {
    char* r = p;
    p += plan_part(plan, name);
    return r;
  };
  resid_ = reinterpret_cast<float*>(part("residual"));
  delta_ = reinterpret_cast<float*>(part("delta"));
  xn_ = reinterpret_cast<float*>(part("activations"));
  qkv_ = reinterpret_cast<float*>(part("qkv"));
  q_ = reinterpret_cast<float*>(part("queries"));
  gate_up_ = reinterpret_cast<float*>(part("gate_up"));
  logits_ = reinterpret_cast<float*>(part("logits"));
  part_ml_ = reinterpret_cast<float*>(part("attention_partials_ml"));
  part_acc_ = reinterpret_cast<float*>(part("attention_partials_acc"));
  sample_work_ = reinterpret_cast<float*>(part("sampler"));
  inv_freq_ = reinterpret_cast<float*>(part("rope_frequencies"));
  sample_params_ = reinterpret_cast<SampleRow*>(part("sampler_rows"));
  tokens_ = reinterpret_cast<int32_t*>(part("tokens"));
  meta_ = reinterpret_cast<int32_t*>(part("step_metadata"));
  meta_ints_ = plan_part(plan, "step_metadata") / 4;
  lt_workspace_ = part("cublaslt");
  split_ = plan_part(plan, "operand_split") ? reinterpret_cast<bf16*>(part("operand_split")) : nullptr;
  op16_ = plan_part(plan, "operand_fp16") ? reinterpret_cast<f16*>(part("operand_fp16")) : nullptr;
  row_scale_ = reinterpret_cast<float*>(part("operand_row_scales"));
  attn_counters_ = reinterpret_cast<int*>(part("attention_counters"));
  HEARTH_CUDA(cudaMemset(attn_counters_, 0, plan_part(plan, "attention_counters")));
  norm_parts_ = reinterpret_cast<float*>(part("norm_partials"));
  nvfp4_expanded_ = part("nvfp4_expanded");
  gemv_amax_ = plan_part(plan, "gemv_amax") ? reinterpret_cast<float*>(part("gemv_amax")) : nullptr;
  auto moe_part = [&](const char* name) -> char* {  // null where the plan has none (dense models)
    char* r = part(name);
    return plan_part(plan, name) ? r : nullptr;
  };
  moe_logits_ = reinterpret_cast<float*>(moe_part("moe_logits"));
  moe_pair_experts_ = reinterpret_cast<int32_t*>(moe_part("moe_pair_experts"));
  moe_pair_weights_ = reinterpret_cast<float*>(moe_part("moe_pair_weights"));
  moe_act_ = reinterpret_cast<float*>(moe_part("moe_activations"));
  moe_y_ = reinterpret_cast<float*>(moe_part("moe_outputs"));
  moe_shared_y_ = reinterpret_cast<float*>(moe_part("moe_shared_outputs"));
  moe_sorted_ = reinterpret_cast<int32_t*>(moe_part("moe_sorted_pairs"));
  moe_tiles_ = reinterpret_cast<int32_t*>(moe_part("moe_tiles"));
  moe_counters_ = reinterpret_cast<int*>(moe_part("moe_counters"));
  if (moe_counters_) HEARTH_CUDA(cudaMemset(moe_counters_, 0, plan_part(plan, "moe_counters")));
  HEARTH_REQUIRE(p == workspace_.as<char>() + plan.workspace_bytes, "workspace layout disagrees with the plan");

  HEARTH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HEARTH_CUDA(cudaEventCreateWithFlags(&meta_done_, cudaEventDisableTiming));
  meta_host_ = PinnedBuffer(meta_ints_ * 4);
  token_host_ = PinnedBuffer((size_t)cache_.max_batch * 4);
  const std::vector<float> inv = rope_inv_freq(cfg_);
  HEARTH_CUDA(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
}

Model::~Model() {
  if (stream_) cudaStreamSynchronize(stream_);  // queued loads have left the ring buffers
  loader_.reset();
  if (meta_done_) cudaEventDestroy(meta_done_);
  for (DecodeGraph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  if (stream_) cudaStreamDestroy(stream_);
}

void Model::load_tensor(Slot slot, int layer, const std::string& path, int64_t file_offset,
                        int64_t nbytes, int dtype, int64_t elem_offset, int64_t numel) {
  int64_t capacity = 0;
  uint16_t* dest = weights_.slot(cfg_, slot, layer, &capacity);
  HEARTH_REQUIRE(elem_offset >= 0 && elem_offset + numel <= capacity,
                 "tensor does not fit its destination (shape differs from the config)");
  if (!loader_) loader_ = std::make_unique<WeightLoader>(stream_);
  loader_->load(dest + elem_offset, path, file_offset, nbytes, dtype, numel);
}

void Model::load_nvfp4(Slot slot, int layer, const uint8_t* codes, int64_t code_bytes,
                       const uint8_t* block_scales, int64_t scale_bytes, float global_scale) {
  Linear& proj = weights_.projection(slot, layer);
  HEARTH_REQUIRE(proj.w.format == WeightFormat::NvFp4, "load_nvfp4: this model's projections are not NVFP4");
  HEARTH_REQUIRE(code_bytes == (int64_t)proj.n * proj.k / 2 && scale_bytes == (int64_t)proj.n * proj.k / 16,
                 "load_nvfp4: codes or block scales do not match the projection's shape");
  HEARTH_REQUIRE(std::isfinite(global_scale) && global_scale > 0.f, "load_nvfp4: the global scale must be positive");
  // Host memory the caller owns: synchronous copies (the stream holds no pending work for these).
  HEARTH_CUDA(cudaMemcpy(const_cast<void*>(proj.w.data), codes, code_bytes, cudaMemcpyHostToDevice));
  HEARTH_CUDA(cudaMemcpy(const_cast<uint8_t*>(proj.w.block_scales), block_scales, scale_bytes,
                         cudaMemcpyHostToDevice));
  proj.w.scale = global_scale;
}

void Model::load_nvfp4_expert(Slot slot, int layer, int expert, const uint8_t* codes,
                              int64_t code_bytes, const uint8_t* block_scales, int64_t scale_bytes,
                              float global_scale) {
  const ModelWeights::ExpertPart part = weights_.expert_part(slot, layer, expert);
  HEARTH_REQUIRE(code_bytes == part.code_bytes && scale_bytes == part.scale_bytes,
                 "load_nvfp4_expert: codes or block scales do not match the expert's shape");
  HEARTH_REQUIRE(std::isfinite(global_scale) && global_scale > 0.f,
                 "load_nvfp4_expert: the global scale must be positive");
  HEARTH_CUDA(cudaMemcpy(part.codes, codes, code_bytes, cudaMemcpyHostToDevice));
  HEARTH_CUDA(cudaMemcpy(part.block_scales, block_scales, scale_bytes, cudaMemcpyHostToDevice));
  HEARTH_CUDA(cudaMemcpy(part.global_scale, &global_scale, sizeof(float), cudaMemcpyHostToDevice));
}

void Model::finish_load() {
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
  loader_.reset();
  weights_.finish(cfg_, stream_);
  cublaslt_available();  // load the library now rather than at the first prompt
  if (!env_is("HEARTH_CUDA_GRAPHS", "0")) capture_decode_graphs();
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
}

int Model::allocate_sequence() { return pool_->allocate_sequence(); }
void Model::release_sequence(int seq) { pool_->release_sequence(seq); }
int Model::length(int seq) const { return pool_->length(seq); }

void Model::truncate(int seq, int length) {
  HEARTH_REQUIRE(length >= 0 && length <= pool_->length(seq), "truncate: length out of range");
  pool_->set_length(seq, length);
}

void Model::prefill(int seq, const std::vector<int32_t>& tokens, float* all_logits) {
  HEARTH_REQUIRE(!tokens.empty(), "prefill needs at least one token");
  check_tokens(tokens);
  const int start = pool_->length(seq);
  const int total = (int)tokens.size();
  pool_->reserve(seq, start + total);
  try {
    // Scoring keeps every row's logits: its chunks fit the logits buffer.
    const int chunk = all_logits ? score_chunk_rows(cache_) : chunk_;
    for (int done = 0; done < total; done += chunk) {
      const int n = std::min(chunk, total - done);
      Step step;
      const auto& blocks = pool_->blocks(seq);
      step.table_stride = (int)blocks.size();
      step.tables = blocks;
      for (int i = 0; i < n; ++i) {
        const int pos = start + done + i;
        step.ids.push_back(tokens[done + i]);
        step.positions.push_back(pos);
        step.slots.push_back(pool_->slot(seq, pos));
        step.kv_lens.push_back(pos + 1);
        step.row_table.push_back(0);
      }
      step.max_kv_len = start + done + n;
      const bool last = done + n == total;
      if (all_logits) {
        forward(step, false, 0, n);
        HEARTH_CUDA(cudaMemcpyAsync(all_logits + (size_t)done * cfg_.vocab, logits_,
                                    (size_t)n * cfg_.vocab * 4, cudaMemcpyDeviceToHost, stream_));
        HEARTH_CUDA(cudaStreamSynchronize(stream_));
      } else {
        forward(step, false, last ? n - 1 : n, last ? 1 : 0);
      }
    }
  } catch (...) {
    pool_->set_length(seq, start);
    throw;
  }
  pool_->set_length(seq, start + total);
}

std::vector<int32_t> Model::sample(const std::vector<SampleRequest>& rows) {
  const int n = (int)rows.size();
  HEARTH_REQUIRE(n == logits_rows_, "sample: one sampler state per row of the last logits");
  HEARTH_REQUIRE(n <= cache_.max_batch, "sample: more rows than max_batch");
  std::vector<SampleRow> params;
  std::vector<int32_t> history;
  build_sample_rows(rows, cfg_.vocab, &params, &history);
  if (history.size() * 4 > history_.bytes())
    history_ = DeviceBuffer(std::max<size_t>(history.size() * 4 * 2, 4096), "sampler history");
  HEARTH_CUDA(cudaMemcpyAsync(sample_params_, params.data(), n * sizeof(SampleRow),
                              cudaMemcpyHostToDevice, stream_));
  if (!history.empty())
    HEARTH_CUDA(cudaMemcpyAsync(history_.get(), history.data(), history.size() * 4,
                                cudaMemcpyHostToDevice, stream_));
  launch_sample(logits_, n, cfg_.vocab, sample_params_, history_.as<int32_t>(), sample_work_,
                tokens_, stream_);
  HEARTH_CUDA(cudaMemcpyAsync(token_host_.as<int32_t>(), tokens_, n * 4, cudaMemcpyDeviceToHost, stream_));
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
  return std::vector<int32_t>(token_host_.as<int32_t>(), token_host_.as<int32_t>() + n);
}

void Model::copy_logits(float* host) const {
  HEARTH_CUDA(cudaMemcpyAsync(host, logits_, (size_t)logits_rows_ * cfg_.vocab * 4,
                              cudaMemcpyDeviceToHost, stream_));
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
}

MemoryReport Model::memory() const {
  return MemoryReport{weights_.buffer.bytes(), kv_.bytes(), workspace_.bytes(), pool_->free_blocks(),
                      pool_->total_blocks(), pool_->block_size(), (int)pool_->sequence_count(),
                      gemm_backend_name(), cfg_.precision == Precision::Fast ? "fast" : "exact"};
}

}  // namespace hearth
