// The resident model: memory plan, weight loading through pinned staging, the forward pass
// (embedding -> per layer: norm, fused qkv, [bias], [q/k norm], rope + cache write, paged
// attention, o-proj, norm, fused gate/up, SwiGLU, down -> final norm -> logits) and sampling.
#include "model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <set>
#include <thread>

#include "../env.h"

namespace hearth {

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

size_t dtype_size(int dtype) {
  switch (dtype) {
    case 0: case 1: return 2;
    case 2: return 4;
  }
  throw std::invalid_argument("tensor dtype must be bf16 (0), fp16 (1) or fp32 (2)");
}

}  // namespace

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
  }
}

Model::Model(const ModelConfig& config, const CacheConfig& cache) : cfg_(config), cache_(cache) {
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
  chunk_ = std::max(cache_.chunk_tokens, cache_.max_batch);
  {
    // bf16 is opt-in: it misses the accuracy bar (model.h)
    decode_gemm_ = env_is("HEARTH_DECODE_GEMM", "bf16")    ? GemmActivations::Bf16
                   : env_is("HEARTH_DECODE_GEMM", "split") ? GemmActivations::Split
                                                           : GemmActivations::Stacked;
    gemv_swiglu_ = !env_is("HEARTH_GEMV_SWIGLU", "0");
    gemv_norm_ = !env_is("HEARTH_GEMV_NORM", "0");
    gemm_fuse_ = !env_is("HEARTH_DECODE_GEMM_FUSE", "0");
    gemv_rope_ = !env_is("HEARTH_GEMV_ROPE", "0");
  }
  HEARTH_CUDA(cudaSetDevice(0));
  plan_memory();
}

Model::~Model() {
  if (stream_) cudaStreamSynchronize(stream_);  // queued loads have left the ring buffers
  release_loader();
  for (auto& kv : maps_) munmap(kv.second.data, kv.second.size);
  for (cudaEvent_t e : staged_)
    if (e) cudaEventDestroy(e);
  if (meta_done_) cudaEventDestroy(meta_done_);
  for (DecodeGraph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void Model::plan_memory() {
  const size_t H = cfg_.hidden, I = cfg_.intermediate, V = cfg_.vocab, L = cfg_.layers;
  const size_t hd = cfg_.head_dim;
  // Weights, in bf16 elements, each piece aligned to 128 elements (256 bytes).
  auto a = [](size_t n) { return align_up(n, 128); };
  const size_t layer_elems = a(H) + a(qkv_size_ * H) + (cfg_.qkv_bias ? a(qkv_size_) : 0) +
                             (cfg_.qk_norm ? 2 * a(hd) : 0) + a(H * q_size_) + a(H) +
                             a(2 * I * H) + a(H * I);
  const size_t weight_elems = a(V * H) + a(H) + (cfg_.tied_embeddings ? 0 : a(V * H)) + L * layer_elems;
  const size_t weight_bytes = weight_elems * 2;

  // Workspace, in bytes.
  const size_t C = chunk_, B = cache_.max_batch;
  // decode partials [B, heads, kMaxSplits]; prefill key-split partials [splits x rows, heads]
  part_rows_ = (int)std::max<size_t>(B * kMaxSplits, 1024);
  const size_t xn_width = std::max({H, (size_t)q_size_, I});
  std::vector<size_t> parts = {
      C * H * 4, C * H * 4, C * xn_width * 4, C * qkv_size_ * 4, C * q_size_ * 4,
      C * 2 * I * 4, C * V * 4,
      (size_t)part_rows_ * cfg_.heads * 2 * 4, (size_t)part_rows_ * cfg_.heads * hd * 4,
      B * V * 4, hd / 2 * 4, B * sizeof(SampleRow), B * 4,
      (5 * C + std::max<size_t>(B, 1) * cache_.max_sequence_blocks) * 4, lt_workspace_bytes_,
      2 * C * xn_width * 2, std::max<size_t>(B, 1) * cfg_.heads * 4,
      // the stacked decode product's [2 rows, n] output, for buckets past the GEMV
      B > (size_t)kGemvMaxRows ? 2 * B * std::max({(size_t)qkv_size_, 2 * I, H, V}) * 4 : 0,
      // per-block sums of squares of the residual rows (fused RMSNorm): at most one per output
      (size_t)kGemvMaxRows * H * 4};
  size_t workspace_bytes = 0;
  for (size_t& p : parts) p = align_up(p, 256), workspace_bytes += p;

  const size_t block_bytes = 2 * L * cache_.block_size * kv_size_ * 2;
  size_t free_b = 0, total_b = 0;
  HEARTH_CUDA(cudaMemGetInfo(&free_b, &total_b));
  int blocks = cache_.block_count;
  if (blocks <= 0) {
    const size_t fixed = weight_bytes + workspace_bytes + cache_.reserve_bytes;
    const size_t want = (size_t)cache_.max_batch * cache_.max_sequence_blocks;
    const size_t fit = free_b > fixed ? (size_t)((free_b - fixed) * 0.9) / block_bytes : 0;
    blocks = (int)std::min(want, fit);
    if (blocks < 1) blocks = cache_.max_sequence_blocks;  // let the check below report it
  }
  const size_t kv_bytes = (size_t)(blocks + 1) * block_bytes;  // + the padding rows' block
  const size_t needed = weight_bytes + workspace_bytes + kv_bytes;
  if (needed > free_b)
    throw DeviceOutOfMemory("not enough GPU memory to load this model: " + std::to_string(needed) +
                                " bytes needed (weights " + std::to_string(weight_bytes) +
                                ", KV cache " + std::to_string(kv_bytes) + ", workspace " +
                                std::to_string(workspace_bytes) + "), " + std::to_string(free_b) +
                                " free",
                            needed, free_b);

  weights_ = DeviceBuffer(weight_bytes, "weights");
  kv_ = DeviceBuffer(kv_bytes, "KV cache");
  workspace_ = DeviceBuffer(workspace_bytes, "workspace");
  pool_ = std::make_unique<KvPool>(blocks, cache_.block_size, cache_.max_sequence_blocks);
  kv_layer_elems_ = (size_t)(blocks + 1) * cache_.block_size * kv_size_;
  dummy_block_ = blocks;

  bf16* w = weights_.as<bf16>();
  auto take = [&](size_t n) { bf16* p = w; w += a(n); return p; };
  embed_ = take(V * H);
  final_norm_ = take(H);
  lm_head_ = cfg_.tied_embeddings ? embed_ : take(V * H);
  layers_.resize(L);
  for (auto& lw : layers_) {
    lw.attn_norm = take(H);
    lw.wqkv = take(qkv_size_ * H);
    lw.bqkv = cfg_.qkv_bias ? take(qkv_size_) : nullptr;
    lw.q_norm = cfg_.qk_norm ? take(hd) : nullptr;
    lw.k_norm = cfg_.qk_norm ? take(hd) : nullptr;
    lw.wo = take(H * q_size_);
    lw.mlp_norm = take(H);
    lw.wgu = take(2 * I * H);
    lw.wdown = take(H * I);
  }

  char* p = workspace_.as<char>();
  size_t i = 0;
  auto next = [&]() { char* r = p; p += parts[i++]; return r; };
  resid_ = reinterpret_cast<float*>(next());
  delta_ = reinterpret_cast<float*>(next());
  xn_ = reinterpret_cast<float*>(next());
  qkv_ = reinterpret_cast<float*>(next());
  q_ = reinterpret_cast<float*>(next());
  gate_up_ = reinterpret_cast<float*>(next());
  logits_ = reinterpret_cast<float*>(next());
  part_ml_ = reinterpret_cast<float*>(next());
  part_acc_ = reinterpret_cast<float*>(next());
  sample_work_ = reinterpret_cast<float*>(next());
  inv_freq_ = reinterpret_cast<float*>(next());
  sample_params_ = reinterpret_cast<SampleRow*>(next());
  tokens_ = reinterpret_cast<int32_t*>(next());
  meta_ = reinterpret_cast<int32_t*>(next());
  meta_ints_ = parts[i - 1] / 4;
  lt_workspace_ = next();
  split_ = reinterpret_cast<bf16*>(next());
  attn_counters_ = reinterpret_cast<int*>(next());
  HEARTH_CUDA(cudaMemset(attn_counters_, 0, parts[i - 1]));
  stacked_ = reinterpret_cast<float*>(next());
  if (parts[i - 1] == 0) stacked_ = nullptr;  // max_batch <= kGemvMaxRows: never a decode GEMM
  norm_parts_ = reinterpret_cast<float*>(next());

  HEARTH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  HEARTH_CUDA(cudaEventCreateWithFlags(&meta_done_, cudaEventDisableTiming));
  meta_host_ = PinnedBuffer(meta_ints_ * 4);
  token_host_ = PinnedBuffer(B * 4);
  const std::vector<float> inv = rope_inv_freq(cfg_);
  HEARTH_CUDA(cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
}

bf16* Model::slot_pointer(Slot slot, int layer, int64_t* numel) {
  const int64_t H = cfg_.hidden, I = cfg_.intermediate, V = cfg_.vocab, hd = cfg_.head_dim;
  auto global = [&](bf16* p, int64_t n) { *numel = n; return p; };
  if (slot == Slot::Embed) return global(embed_, V * H);
  if (slot == Slot::FinalNorm) return global(final_norm_, H);
  if (slot == Slot::LmHead) {
    HEARTH_REQUIRE(!cfg_.tied_embeddings, "lm_head given for a model with tied embeddings");
    return global(lm_head_, V * H);
  }
  HEARTH_REQUIRE(layer >= 0 && layer < cfg_.layers, "layer index out of range");
  LayerWeights& lw = layers_[layer];
  bf16* p = nullptr;
  switch (slot) {
    case Slot::AttnNorm: p = lw.attn_norm; *numel = H; break;
    case Slot::Wqkv: p = lw.wqkv; *numel = qkv_size_ * H; break;
    case Slot::Bqkv: p = lw.bqkv; *numel = qkv_size_; break;
    case Slot::QNorm: p = lw.q_norm; *numel = hd; break;
    case Slot::KNorm: p = lw.k_norm; *numel = hd; break;
    case Slot::Wo: p = lw.wo; *numel = H * q_size_; break;
    case Slot::MlpNorm: p = lw.mlp_norm; *numel = H; break;
    case Slot::Wgu: p = lw.wgu; *numel = 2 * I * H; break;
    case Slot::Wdown: p = lw.wdown; *numel = H * I; break;
    default: break;
  }
  HEARTH_REQUIRE(p != nullptr, "this model has no such weight (bias or q/k norm not configured)");
  return p;
}

void Model::load_tensor(Slot slot, int layer, const std::string& path, int64_t file_offset,
                        int64_t nbytes, int dtype, int64_t elem_offset, int64_t numel) {
  int64_t capacity = 0;
  bf16* dest = slot_pointer(slot, layer, &capacity);
  const size_t es = dtype_size(dtype);
  HEARTH_REQUIRE(nbytes == numel * (int64_t)es, "tensor byte size disagrees with its shape");
  HEARTH_REQUIRE(elem_offset >= 0 && elem_offset + numel <= capacity,
                 "tensor does not fit its destination (shape differs from the config)");
  if (load_threads_ == 0) {
    const char* v = std::getenv("HEARTH_LOAD_THREADS");
    const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    load_threads_ = v && *v ? std::max(1, std::atoi(v)) : std::min(8, cores);
  }
  if (load_threads_ > 1) {
    load_tensor_threaded(dest + elem_offset, path, file_offset, nbytes, dtype, numel);
    return;
  }
  auto it = maps_.find(path);
  if (it == maps_.end()) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    fstat(fd, &st);
    void* data = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (data == MAP_FAILED) throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
    it = maps_.emplace(path, Mapping{data, (size_t)st.st_size}).first;
  }
  HEARTH_REQUIRE(file_offset >= 0 && (size_t)(file_offset + nbytes) <= it->second.size,
                 "tensor data lies past the end of " + path);
  if (!staged_[0]) {
    for (int i = 0; i < 2; ++i) {
      staging_[i] = PinnedBuffer(staging_bytes_);
      scratch_[i] = DeviceBuffer(staging_bytes_, "load staging");
      HEARTH_CUDA(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming));
    }
  }
  const char* src = static_cast<const char*>(it->second.data) + file_offset;
  const int64_t chunk_elems = (int64_t)(staging_bytes_ / es);
  int turn = 0;
  for (int64_t done = 0; done < numel; done += chunk_elems, turn ^= 1) {
    const int64_t n = std::min(chunk_elems, numel - done);
    HEARTH_CUDA(cudaEventSynchronize(staged_[turn]));
    std::memcpy(staging_[turn].as<char>(), src + done * es, n * es);
    bf16* out = dest + elem_offset + done;
    if (dtype == 0) {
      HEARTH_CUDA(cudaMemcpyAsync(out, staging_[turn].as<char>(), n * es, cudaMemcpyHostToDevice, stream_));
    } else {
      HEARTH_CUDA(cudaMemcpyAsync(scratch_[turn].get(), staging_[turn].as<char>(), n * es,
                                  cudaMemcpyHostToDevice, stream_));
      launch_convert_to_bf16(scratch_[turn].get(), dtype, out, n, stream_);
    }
    HEARTH_CUDA(cudaEventRecord(staged_[turn], stream_));
  }
  HEARTH_CUDA(cudaStreamSynchronize(stream_));  // the tensor has landed
}

void Model::load_tensor_threaded(bf16* dest, const std::string& path, int64_t file_offset,
                                 int64_t nbytes, int dtype, int64_t numel) {
  auto it = files_.find(path);
  if (it == files_.end()) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    it = files_.emplace(path, fd).first;
  }
  struct stat st {};
  if (fstat(it->second, &st) != 0) throw std::runtime_error("cannot stat " + path);
  HEARTH_REQUIRE(file_offset >= 0 && file_offset + nbytes <= (int64_t)st.st_size,
                 "tensor data lies past the end of " + path);
  if (!readers_) {
    readers_ = std::make_unique<ReadPool>(load_threads_);
    for (int i = 0; i < kRing; ++i) {
      ring_[i] = PinnedBuffer(staging_bytes_);
      HEARTH_CUDA(cudaEventCreateWithFlags(&ring_done_[i], cudaEventDisableTiming));
    }
  }
  const size_t es = dtype_size(dtype);
  const int64_t chunk_elems = (int64_t)(staging_bytes_ / es);
  for (int64_t done = 0; done < numel; done += chunk_elems) {
    const int64_t n = std::min(chunk_elems, numel - done);
    const int slot = ring_next_;
    ring_next_ = (ring_next_ + 1) % kRing;
    HEARTH_CUDA(cudaEventSynchronize(ring_done_[slot]));  // its previous copy has left the buffer
    char* host = ring_[slot].as<char>();
    readers_->read(it->second, file_offset + done * (int64_t)es, host, (size_t)(n * es), path);
    bf16* out = dest + done;
    if (dtype == 0) {
      HEARTH_CUDA(cudaMemcpyAsync(out, host, n * es, cudaMemcpyHostToDevice, stream_));
    } else {
      if (!ring_scratch_[slot].get()) ring_scratch_[slot] = DeviceBuffer(staging_bytes_, "load staging");
      HEARTH_CUDA(cudaMemcpyAsync(ring_scratch_[slot].get(), host, n * es, cudaMemcpyHostToDevice, stream_));
      launch_convert_to_bf16(ring_scratch_[slot].get(), dtype, out, n, stream_);
    }
    HEARTH_CUDA(cudaEventRecord(ring_done_[slot], stream_));
  }
}

void Model::release_loader() {
  readers_.reset();
  for (auto& kv : files_) close(kv.second);
  files_.clear();
  for (int i = 0; i < kRing; ++i) {
    if (ring_done_[i]) cudaEventDestroy(ring_done_[i]);
    ring_done_[i] = nullptr;
    ring_[i] = PinnedBuffer();
    ring_scratch_[i].reset();
  }
  ring_next_ = 0;
}

void Model::finish_load() {
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
  release_loader();
  for (auto& kv : maps_) munmap(kv.second.data, kv.second.size);
  maps_.clear();
  for (int i = 0; i < 2; ++i) {
    if (staged_[i]) cudaEventDestroy(staged_[i]);
    staged_[i] = nullptr;
    staging_[i] = PinnedBuffer();
    scratch_[i].reset();
  }
  cublaslt_available();  // load the library now rather than at the first prompt
  if (!env_is("HEARTH_CUDA_GRAPHS", "0")) capture_decode_graphs();
}

std::vector<int> Model::graph_buckets() const {
  std::vector<int> out;
  for (const DecodeGraph& g : graphs_) out.push_back(g.rows);
  return out;
}

int Model::bucket_for(int rows) const {
  for (const DecodeGraph& g : graphs_)
    if (g.rows >= rows) return g.rows;
  return rows;
}

void Model::capture_decode_graphs() {
  if (!graphs_.empty()) return;
  std::vector<int> sizes;
  for (int b = 1; b < cache_.max_batch; b *= 2) sizes.push_back(b);
  sizes.push_back(cache_.max_batch);
  const int stride = cache_.max_sequence_blocks;
  for (int rows : sizes) {
    // Every row a padding row: they write and read the dummy block only.
    Step step = decode_step({}, {}, rows);
    upload_meta(step, stride);
    run_layers(rows, stride, true, 0, rows);  // uncaptured once: loads cuBLASLt plans, checks launches
    HEARTH_CUDA(cudaStreamSynchronize(stream_));
    cudaGraph_t graph = nullptr;
    HEARTH_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      run_layers(rows, stride, true, 0, rows);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    HEARTH_CUDA(cudaStreamEndCapture(stream_, &graph));
    DecodeGraph g;
    g.rows = rows;
    const cudaError_t status = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    HEARTH_CUDA(status);
    graphs_.push_back(g);
    HEARTH_CUDA(cudaGraphLaunch(g.exec, stream_));  // warm-up replay
  }
  HEARTH_CUDA(cudaStreamSynchronize(stream_));
  logits_rows_ = 0;
}

int Model::allocate_sequence() { return pool_->allocate_sequence(); }
void Model::release_sequence(int seq) { pool_->release_sequence(seq); }
int Model::length(int seq) const { return pool_->length(seq); }

void Model::truncate(int seq, int length) {
  HEARTH_REQUIRE(length >= 0 && length <= pool_->length(seq), "truncate: length out of range");
  pool_->set_length(seq, length);
}

void Model::check_tokens(const std::vector<int32_t>& tokens) const {
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab)
      throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary of " +
                              std::to_string(cfg_.vocab));
}

void Model::matmul(const float* x, const bf16* w, float* out, int rows, int n, int k) {
  if (rows <= kGemvMaxRows && k % 8 == 0)
    launch_gemv(x, w, out, rows, n, k, stream_);
  else
    launch_gemm(x, w, out, rows, n, k, split_, lt_workspace_, lt_workspace_bytes_, stream_,
                in_decode_ && stacked_ ? decode_gemm_ : GemmActivations::Split, stacked_);
}

void Model::prefill(int seq, const std::vector<int32_t>& tokens, float* all_logits) {
  HEARTH_REQUIRE(!tokens.empty(), "prefill needs at least one token");
  check_tokens(tokens);
  const int start = pool_->length(seq);
  const int total = (int)tokens.size();
  pool_->reserve(seq, start + total);
  try {
    for (int done = 0; done < total; done += chunk_) {
      const int n = std::min(chunk_, total - done);
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

Model::Step Model::decode_step(const std::vector<int>& seqs, const std::vector<int32_t>& tokens,
                              int rows) {
  Step step;
  for (int s : seqs) step.table_stride = std::max(step.table_stride, (int)pool_->blocks(s).size());
  step.tables.assign((size_t)rows * step.table_stride, dummy_block_);
  for (int r = 0; r < rows; ++r) {
    if (r < (int)seqs.size()) {
      const int s = seqs[r];
      const int pos = pool_->length(s);
      const auto& blocks = pool_->blocks(s);
      std::copy(blocks.begin(), blocks.end(), step.tables.begin() + (size_t)r * step.table_stride);
      step.ids.push_back(tokens[r]);
      step.positions.push_back(pos);
      step.slots.push_back(pool_->slot(s, pos));
      step.kv_lens.push_back(pos + 1);
      step.max_kv_len = std::max(step.max_kv_len, pos + 1);
    } else {  // padding: token 0 at position 0 of the dummy block
      step.ids.push_back(0);
      step.positions.push_back(0);
      step.slots.push_back(dummy_block_ * cache_.block_size);
      step.kv_lens.push_back(1);
      step.max_kv_len = std::max(step.max_kv_len, 1);
    }
    step.row_table.push_back(r);
  }
  return step;
}

void Model::decode(const std::vector<int>& seqs, const std::vector<int32_t>& tokens) {
  HEARTH_REQUIRE(seqs.size() == tokens.size() && !seqs.empty(), "decode: one token per sequence");
  HEARTH_REQUIRE((int)seqs.size() <= cache_.max_batch, "decode: more sequences than max_batch");
  check_tokens(tokens);
  std::set<int> unique(seqs.begin(), seqs.end());
  HEARTH_REQUIRE(unique.size() == seqs.size(), "decode: a sequence appears twice");
  std::vector<int> reserved;
  try {
    for (int s : seqs) {
      pool_->reserve(s, pool_->length(s) + 1);
      reserved.push_back(s);
    }
  } catch (...) {
    for (int s : reserved) pool_->set_length(s, pool_->length(s));  // give back unused blocks
    throw;
  }
  const int n = (int)seqs.size();
  const int rows = bucket_for(n);
  const DecodeGraph* graph = nullptr;
  for (const DecodeGraph& g : graphs_)
    if (g.rows == rows) graph = &g;
  Step step = decode_step(seqs, tokens, rows);
  if (graph) {
    upload_meta(step, cache_.max_sequence_blocks);
    HEARTH_CUDA(cudaGraphLaunch(graph->exec, stream_));
  } else {
    upload_meta(step, step.table_stride);
    run_layers(rows, step.table_stride, true, 0, rows);
  }
  logits_rows_ = n;  // the padding rows' logits are never read
  for (int s : seqs) pool_->set_length(s, pool_->length(s) + 1);
}

std::vector<int32_t> Model::decode_sample(const std::vector<int>& seqs,
                                          const std::vector<int32_t>& tokens,
                                          const std::vector<SampleRequest>& rows) {
  HEARTH_REQUIRE(rows.size() == seqs.size(), "decode_sample: one sampler state per sequence");
  decode(seqs, tokens);
  return sample(rows);
}

void Model::upload_meta(const Step& step, int device_stride) {
  const int T = (int)step.ids.size();
  const size_t head = 5 * (size_t)T;
  HEARTH_REQUIRE(device_stride >= step.table_stride, "forward: table stride too small");
  const size_t table_rows = step.tables.size() / std::max(1, step.table_stride);  // 1 for a prompt
  HEARTH_REQUIRE(head + table_rows * device_stride <= meta_ints_,
                 "forward: step metadata larger than planned");
  HEARTH_CUDA(cudaEventSynchronize(meta_done_));  // the previous upload has left the pinned buffer
  int32_t* host = meta_host_.as<int32_t>();
  size_t off = 0;
  for (const auto* v : {&step.ids, &step.positions, &step.slots, &step.kv_lens, &step.row_table,
                        &step.tables}) {
    std::copy(v->begin(), v->end(), host + off);
    off += v->size();
  }
  if (device_stride == step.table_stride) {
    HEARTH_CUDA(cudaMemcpyAsync(meta_, host, off * 4, cudaMemcpyHostToDevice, stream_));
  } else {
    HEARTH_CUDA(cudaMemcpyAsync(meta_, host, head * 4, cudaMemcpyHostToDevice, stream_));
    if (table_rows > 0)
      HEARTH_CUDA(cudaMemcpy2DAsync(meta_ + head, (size_t)device_stride * 4, host + head,
                                    (size_t)step.table_stride * 4, (size_t)step.table_stride * 4,
                                    table_rows,
                                    cudaMemcpyHostToDevice, stream_));
  }
  HEARTH_CUDA(cudaEventRecord(meta_done_, stream_));
}

void Model::forward(const Step& step, bool decode_mode, int logit_first, int logit_count) {
  upload_meta(step, step.table_stride);
  step_max_kv_ = step.max_kv_len;
  if (!decode_mode)  // read per prompt chunk, so one process can compare (bench --ab)
    prefill_ksplit_ = !env_is("HEARTH_PREFILL_KSPLIT", "0");
  run_layers((int)step.ids.size(), step.table_stride, decode_mode, logit_first, logit_count);
  logits_rows_ = logit_count;
}

void Model::run_layers(int T, int table_stride, bool decode_mode, int logit_first, int logit_count) {
  const int H = cfg_.hidden, I = cfg_.intermediate, V = cfg_.vocab, hd = cfg_.head_dim;
  const int32_t* d_ids = meta_;
  const int32_t* d_pos = meta_ + T;
  const int32_t* d_slots = meta_ + 2 * T;
  const int32_t* d_kv_lens = meta_ + 3 * T;
  const int32_t* d_row_table = meta_ + 4 * T;
  const int32_t* d_tables = meta_ + 5 * T;

  in_decode_ = decode_mode;
  // Up to kGemvNormMaxRows rows: RMSNorm lives in the GEMVs (o / down add into the residual stream and
  // leave its sums of squares; qkv / gate-up / lm_head normalize on the fly): no norm kernels.
  const bool fused_norm = gemv_norm_ && T <= kGemvNormMaxRows && H % 8 == 0 && q_size_ % 8 == 0 &&
                          I % 8 == 0;
  launch_embedding(d_ids, T, embed_, V, H, resid_, stream_, fused_norm ? norm_parts_ : nullptr);
  // Stacked decode GEMM with its neighbours fused (model.h): o / down leave their two halves in
  // stacked_ (the residual delta), RMSNorm and SwiGLU write the hi / lo operand into split_.
  const bool gemm_fused = gemm_fuse_ && decode_mode && stacked_ &&
                          decode_gemm_ == GemmActivations::Stacked && T > kGemvMaxRows &&
                          cublaslt_available();
  auto gemm_stacked = [&](const float* x, const bf16* w, float* out, int n, int k) {
    launch_gemm(x, w, out, T, n, k, split_, lt_workspace_, lt_workspace_bytes_, stream_,
                GemmActivations::Stacked, stacked_);
  };
  const float* delta = gemm_fused ? stacked_ : delta_;
  const float* delta_lo = gemm_fused ? stacked_ + (size_t)T * H : nullptr;
  bf16* hi = gemm_fused ? split_ : nullptr;
  int norm_count = 1;  // partial sums of squares per row in norm_parts_: embedding, o, down
  const int o_blocks = fused_norm ? gemv_blocks(T, H, q_size_) : 0;
  const int down_blocks = fused_norm ? gemv_blocks(T, H, I) : 0;
  const GemvResidual into_residual{norm_parts_};
  const bool rope_in_gemv = fused_norm && gemv_rope_ && gemv_rope_supported(T, qkv_size_, H);
  for (int l = 0; l < cfg_.layers; ++l) {
    const LayerWeights& lw = layers_[l];
    bf16* k_cache = kv_.as<bf16>() + (size_t)(2 * l) * kv_layer_elems_;
    bf16* v_cache = k_cache + kv_layer_elems_;
    const RopeTarget rope{d_pos, d_slots, inv_freq_, q_, k_cache, v_cache, cfg_.heads,
                          cfg_.kv_heads, hd};
    // The qkv GEMV stores q / k / v rotated itself where nothing sits between it and rope.
    const bool roped = rope_in_gemv && !lw.bqkv && !lw.q_norm;
    if (fused_norm) {
      const GemvNorm norm{lw.attn_norm, norm_parts_, norm_count, cfg_.rms_eps};
      if (roped)
        launch_gemv_rope(resid_, lw.wqkv, T, qkv_size_, H, stream_, norm, rope);
      else
        launch_gemv(resid_, lw.wqkv, qkv_, T, qkv_size_, H, stream_, &norm);
    } else if (gemm_fused) {
      launch_rmsnorm_residual(resid_, l == 0 ? nullptr : delta, lw.attn_norm, nullptr, T, H,
                              cfg_.rms_eps, stream_, l == 0 ? nullptr : delta_lo, hi, hi + (size_t)T * H);
      gemm_stacked(nullptr, lw.wqkv, qkv_, qkv_size_, H);
    } else {
      launch_rmsnorm_residual(resid_, l == 0 ? nullptr : delta_, lw.attn_norm, xn_, T, H, cfg_.rms_eps, stream_);
      matmul(xn_, lw.wqkv, qkv_, T, qkv_size_, H);
    }
    if (lw.bqkv) launch_add_bias(qkv_, lw.bqkv, T, qkv_size_, stream_);
    if (lw.q_norm) {
      launch_head_rmsnorm(qkv_, T, qkv_size_, 0, cfg_.heads, hd, lw.q_norm, cfg_.rms_eps, stream_);
      launch_head_rmsnorm(qkv_, T, qkv_size_, q_size_, cfg_.kv_heads, hd, lw.k_norm, cfg_.rms_eps, stream_);
    }
    if (!roped) launch_rope_kv_write(qkv_, T, rope, stream_);
    PagedAttention att{q_, k_cache, v_cache, d_tables, d_row_table, d_kv_lens, xn_, T, cfg_.heads,
                       cfg_.kv_heads, hd, cache_.block_size, table_stride,
                       1.f / std::sqrt((float)hd)};
    if (decode_mode) {
      launch_decode_attention(att, 0, kMaxSplits, part_ml_, part_acc_, attn_counters_, stream_);
    } else {
      const PrefillSplitWork work{part_ml_, part_acc_, part_rows_, step_max_kv_};
      launch_prefill_attention(att, stream_, prefill_ksplit_ && step_max_kv_ > 0 ? &work : nullptr);
    }
    if (fused_norm) {
      launch_gemv(xn_, lw.wo, resid_, T, H, q_size_, stream_, nullptr, &into_residual);
      norm_count = o_blocks;
      const GemvNorm norm{lw.mlp_norm, norm_parts_, norm_count, cfg_.rms_eps};
      const float* mlp_in = gate_up_;
      if (gemv_swiglu_ && gemv_swiglu_supported(T, I, H)) {
        launch_gemv_swiglu(resid_, lw.wgu, gate_up_, T, I, H, stream_, &norm);
      } else {
        launch_gemv(resid_, lw.wgu, gate_up_, T, 2 * I, H, stream_, &norm);
        launch_swiglu(gate_up_, xn_, T, I, stream_);
        mlp_in = xn_;
      }
      launch_gemv(mlp_in, lw.wdown, resid_, T, H, I, stream_, nullptr, &into_residual);
      norm_count = down_blocks;
      continue;
    }
    if (gemm_fused) {
      gemm_stacked(xn_, lw.wo, nullptr, H, q_size_);
      launch_rmsnorm_residual(resid_, delta, lw.mlp_norm, nullptr, T, H, cfg_.rms_eps, stream_,
                              delta_lo, hi, hi + (size_t)T * H);
      gemm_stacked(nullptr, lw.wgu, nullptr, 2 * I, H);
      launch_swiglu(stacked_, nullptr, T, I, stream_, stacked_ + (size_t)T * 2 * I, hi,
                    hi + (size_t)T * I);
      gemm_stacked(nullptr, lw.wdown, nullptr, H, I);
      continue;
    }
    matmul(xn_, lw.wo, delta_, T, H, q_size_);
    launch_rmsnorm_residual(resid_, delta_, lw.mlp_norm, xn_, T, H, cfg_.rms_eps, stream_);
    if (gemv_swiglu_ && T <= kGemvMaxRows && gemv_swiglu_supported(T, I, H)) {
      launch_gemv_swiglu(xn_, lw.wgu, gate_up_, T, I, H, stream_);
      matmul(gate_up_, lw.wdown, delta_, T, H, I);
    } else {
      matmul(xn_, lw.wgu, gate_up_, T, 2 * I, H);
      launch_swiglu(gate_up_, xn_, T, I, stream_);
      matmul(xn_, lw.wdown, delta_, T, H, I);
    }
  }
  if (logit_count == 0) return;
  const size_t first = (size_t)logit_first * H;
  if (fused_norm) {
    const GemvNorm norm{final_norm_, norm_parts_ + (size_t)logit_first * norm_count, norm_count,
                        cfg_.rms_eps};
    launch_gemv(resid_ + first, lm_head_, logits_, logit_count, V, H, stream_, &norm);
    return;
  }
  launch_rmsnorm_residual(resid_ + first, delta + first, final_norm_, xn_, logit_count, H,
                          cfg_.rms_eps, stream_, delta_lo ? delta_lo + first : nullptr);
  matmul(xn_, lm_head_, logits_, logit_count, V, H);
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
  return MemoryReport{weights_.bytes(), kv_.bytes(), workspace_.bytes(), pool_->free_blocks(),
                      pool_->total_blocks(), pool_->block_size(), (int)pool_->sequence_count(),
                      gemm_backend_name()};
}

}  // namespace hearth
