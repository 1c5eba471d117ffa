// Weight layout, loading and conversion to the resident format (weights.h).
#include "weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "memory_plan.h"

namespace hearth {

namespace {

size_t dtype_size(int dtype) {
  switch (dtype) {
    case 0: case 1: return 2;
    case 2: return 4;
  }
  throw std::invalid_argument("tensor dtype must be bf16 (0), fp16 (1) or fp32 (2)");
}

Linear linear(const void* data, int n, int k) {
  Linear l;
  l.w.data = data;
  l.n = n;
  l.k = k;
  return l;
}

}  // namespace

void ModelWeights::allocate(const ModelConfig& c) {
  buffer = DeviceBuffer(weight_bytes(c), "weights");
  const int H = c.hidden, I = c.intermediate, V = c.vocab, hd = c.head_dim;
  const int q = c.heads * hd, qkv = q + 2 * c.kv_heads * hd;
  char* w = buffer.as<char>();
  auto take_bytes = [&](size_t bytes) { char* p = w; w += weight_piece_bytes(bytes); return p; };
  auto take = [&](size_t elements) { return reinterpret_cast<uint16_t*>(take_bytes(elements * 2)); };
  // A layer projection in the config's format (memory_plan.cpp's projection_bytes).
  auto projection = [&](int n, int k) {
    if (!c.nvfp4) return linear(take((size_t)n * k), n, k);
    Linear l = linear(take_bytes((size_t)n * k / 2), n, k);
    l.w.format = WeightFormat::NvFp4;
    l.w.block_scales = reinterpret_cast<const uint8_t*>(take_bytes((size_t)n * k / 16));
    return l;
  };
  // A layer's experts stacked (memory_plan.cpp's expert_stack_bytes): bf16, or NVFP4 codes, block
  // scales and one global scale per expert.
  auto stack = [&](int experts, int n, int k, WeightView* w, const float** scales) {
    if (!c.nvfp4) {
      w->data = take((size_t)experts * n * k);
      return;
    }
    w->format = WeightFormat::NvFp4;
    w->data = take_bytes((size_t)experts * n * k / 2);
    w->block_scales = reinterpret_cast<const uint8_t*>(take_bytes((size_t)experts * n * k / 16));
    *scales = reinterpret_cast<const float*>(take_bytes((size_t)experts * 4));
  };
  auto experts = [&](int count, int inter) {
    MoeExperts ex;
    ex.experts = count;
    ex.inter = inter;
    ex.hidden = H;
    stack(count, 2 * inter, H, &ex.gate_up, &ex.gate_up_scales);
    stack(count, H, inter, &ex.down, &ex.down_scales);
    return ex;
  };
  embed = linear(take((size_t)V * H), V, H);
  final_norm = reinterpret_cast<const bf16*>(take(H));
  lm_head = c.tied_embeddings ? embed : linear(take((size_t)V * H), V, H);
  layers.assign(c.layers, LayerWeights{});
  const int q_norm_size = c.qk_norm_whole ? q : hd, k_norm_size = c.qk_norm_whole ? c.kv_heads * hd : hd;
  for (int l = 0; l < c.layers; ++l) {
    LayerWeights& lw = layers[l];
    lw.attn_norm = reinterpret_cast<const bf16*>(take(H));
    lw.qkv = projection(qkv, H);
    lw.bqkv = c.qkv_bias ? reinterpret_cast<const bf16*>(take(qkv)) : nullptr;
    lw.q_norm = c.qk_norm ? reinterpret_cast<const bf16*>(take(q_norm_size)) : nullptr;
    lw.k_norm = c.qk_norm ? reinterpret_cast<const bf16*>(take(k_norm_size)) : nullptr;
    lw.o = projection(H, q);
    lw.mlp_norm = reinterpret_cast<const bf16*>(take(H));
    if (!c.routes(l)) {
      lw.gate_up = projection(2 * I, H);
      lw.down = projection(H, I);
      continue;
    }
    lw.router = reinterpret_cast<const bf16*>(take(moe_router_rows(c) * H));
    lw.experts = experts(c.moe_experts, c.moe_inter);
    if (c.moe_shared_inter > 0) lw.shared = experts(1, c.moe_shared_inter);
  }
  HEARTH_REQUIRE(w == buffer.as<char>() + buffer.bytes(), "weight layout disagrees with the plan");
}

Linear& ModelWeights::projection(Slot slot, int layer) {
  HEARTH_REQUIRE(layer >= 0 && layer < (int)layers.size(), "layer index out of range");
  LayerWeights& lw = layers[layer];
  switch (slot) {
    case Slot::Wqkv: return lw.qkv;
    case Slot::Wo: return lw.o;
    case Slot::Wgu: return lw.gate_up;
    case Slot::Wdown: return lw.down;
    default: throw std::invalid_argument("not a layer projection slot");
  }
}

ModelWeights::ExpertPart ModelWeights::expert_part(Slot slot, int layer, int expert) {
  HEARTH_REQUIRE(layer >= 0 && layer < (int)layers.size(), "layer index out of range");
  LayerWeights& lw = layers[layer];
  const bool shared = slot == Slot::MoeSharedGateUp || slot == Slot::MoeSharedDown;
  HEARTH_REQUIRE(shared || slot == Slot::MoeGateUp || slot == Slot::MoeDown, "not an expert slot");
  const MoeExperts& ex = shared ? lw.shared : lw.experts;
  HEARTH_REQUIRE(ex.experts > 0, shared ? "this layer has no shared expert" : "this layer does not route");
  HEARTH_REQUIRE(expert >= 0 && expert < ex.experts, "expert index out of range");
  const bool gate_up = slot == Slot::MoeGateUp || slot == Slot::MoeSharedGateUp;
  const WeightView& w = gate_up ? ex.gate_up : ex.down;
  HEARTH_REQUIRE(w.format == WeightFormat::NvFp4, "this model's experts are 16-bit: they load with load_tensor");
  const int64_t weights = (int64_t)(gate_up ? 2 * ex.inter : ex.hidden) * (gate_up ? ex.hidden : ex.inter);
  auto* codes = static_cast<uint8_t*>(const_cast<void*>(w.data)) + expert * weights / 2;
  auto* scales = const_cast<uint8_t*>(w.block_scales) + expert * weights / 16;
  float* global = const_cast<float*>(gate_up ? ex.gate_up_scales : ex.down_scales) + expert;
  return ExpertPart{codes, scales, global, weights / 2, weights / 16};
}

uint16_t* ModelWeights::slot(const ModelConfig& c, Slot slot, int layer, int64_t* numel) {
  auto at = [&](const void* p, int64_t n) {
    *numel = n;
    return const_cast<uint16_t*>(static_cast<const uint16_t*>(p));
  };
  auto matrix = [&](const Linear& l) {
    HEARTH_REQUIRE(l.w.format != WeightFormat::NvFp4,
                   "this projection is NVFP4 here: its codes and scales load with load_nvfp4");
    return at(l.w.data, (int64_t)l.n * l.k);
  };
  if (slot == Slot::Embed) return matrix(embed);
  if (slot == Slot::FinalNorm) return at(final_norm, c.hidden);
  if (slot == Slot::LmHead) {
    HEARTH_REQUIRE(!c.tied_embeddings, "lm_head given for a model with tied embeddings");
    return matrix(lm_head);
  }
  HEARTH_REQUIRE(layer >= 0 && layer < c.layers, "layer index out of range");
  const LayerWeights& lw = layers[layer];
  const int64_t qkv = (int64_t)(c.heads + 2 * c.kv_heads) * c.head_dim;
  const int64_t q_norm = c.qk_norm_whole ? (int64_t)c.heads * c.head_dim : c.head_dim;
  const int64_t k_norm = c.qk_norm_whole ? (int64_t)c.kv_heads * c.head_dim : c.head_dim;
  auto stack = [&](const MoeExperts& ex, bool gate_up) {
    HEARTH_REQUIRE(ex.experts > 0, "this layer has no such expert weights (it does not route, or has no shared expert)");
    const WeightView& w = gate_up ? ex.gate_up : ex.down;
    HEARTH_REQUIRE(w.format != WeightFormat::NvFp4, "this model's experts are NVFP4: they load with load_nvfp4_expert");
    return at(w.data, (int64_t)ex.experts * (gate_up ? 2 : 1) * ex.inter * ex.hidden);
  };
  const void* p = nullptr;
  switch (slot) {
    case Slot::AttnNorm: return at(lw.attn_norm, c.hidden);
    case Slot::Wqkv: return matrix(lw.qkv);
    case Slot::Bqkv: p = lw.bqkv; *numel = qkv; break;
    case Slot::QNorm: p = lw.q_norm; *numel = q_norm; break;
    case Slot::KNorm: p = lw.k_norm; *numel = k_norm; break;
    case Slot::Wo: return matrix(lw.o);
    case Slot::MlpNorm: return at(lw.mlp_norm, c.hidden);
    case Slot::Wgu: return matrix(lw.gate_up);
    case Slot::Wdown: return matrix(lw.down);
    case Slot::MoeRouter:
      HEARTH_REQUIRE(lw.router != nullptr, "this layer does not route");
      return at(lw.router, (int64_t)c.moe_experts * c.hidden);
    case Slot::MoeSharedGate:
      HEARTH_REQUIRE(lw.router != nullptr && c.moe_shared_inter > 0, "this layer has no shared expert");
      return at(lw.router + (size_t)c.moe_experts * c.hidden, c.hidden);
    case Slot::MoeGateUp: return stack(lw.experts, true);
    case Slot::MoeDown: return stack(lw.experts, false);
    case Slot::MoeSharedGateUp: return stack(lw.shared, true);
    case Slot::MoeSharedDown: return stack(lw.shared, false);
  }
  HEARTH_REQUIRE(p != nullptr, "this model has no such weight (bias or q/k norm not configured)");
  return at(p, *numel);
}

void ModelWeights::finish(const ModelConfig& c, cudaStream_t stream) {
  if (c.precision == Precision::Exact) return;  // bf16 as loaded, every scale 1
  // Every projection and every norm weight: its largest magnitude, in one pass and one sync.
  std::vector<Linear*> projections;
  std::vector<const bf16*> norms;
  projections.push_back(&embed);
  if (!c.tied_embeddings) projections.push_back(&lm_head);
  norms.push_back(final_norm);
  for (LayerWeights& lw : layers) {
    for (Linear* l : {&lw.qkv, &lw.o, &lw.gate_up, &lw.down})
      if (l->n > 0 && l->w.format != WeightFormat::NvFp4) projections.push_back(l);  // NVFP4 stays packed
    norms.push_back(lw.attn_norm);
    norms.push_back(lw.mlp_norm);
  }
  const size_t count = projections.size() + norms.size();
  DeviceBuffer amax(count * sizeof(float), "weight scales");
  HEARTH_CUDA(cudaMemsetAsync(amax.get(), 0, count * sizeof(float), stream));
  float* d = amax.as<float>();
  for (size_t i = 0; i < projections.size(); ++i)
    launch_amax_bf16(static_cast<const bf16*>(projections[i]->w.data),
                     (int64_t)projections[i]->n * projections[i]->k, d + i, stream);
  for (size_t i = 0; i < norms.size(); ++i)
    launch_amax_bf16(norms[i], c.hidden, d + projections.size() + i, stream);
  std::vector<float> host(count);
  HEARTH_CUDA(cudaMemcpyAsync(host.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  HEARTH_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < projections.size(); ++i) {
    Linear& l = *projections[i];
    l.w.scale = fp16_operand_scale(host[i]);
    l.w.format = WeightFormat::Fp16;
    launch_bf16_to_f16_inplace(const_cast<void*>(l.w.data), (int64_t)l.n * l.k, l.w.scale, stream);
  }
  if (c.tied_embeddings) lm_head = embed;
  // A normalized row: |x_i| / rms(x) <= sqrt(hidden), times the norm weight.
  auto norm_scale = [&](size_t i) {
    return fp16_operand_scale(std::sqrt((float)c.hidden) * host[projections.size() + i]);
  };
  final_norm_scale = norm_scale(0);
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].attn_norm_scale = norm_scale(1 + 2 * l);
    layers[l].mlp_norm_scale = norm_scale(2 + 2 * l);
  }
  HEARTH_CUDA(cudaStreamSynchronize(stream));  // amax is freed on return
}

WeightLoader::WeightLoader(cudaStream_t stream) : stream_(stream) {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  readers_ = std::make_unique<ReadPool>(std::min(8, cores));
  for (int i = 0; i < kRing; ++i) {
    ring_[i] = PinnedBuffer(kStagingBytes);
    HEARTH_CUDA(cudaEventCreateWithFlags(&ring_done_[i], cudaEventDisableTiming));
  }
}

WeightLoader::~WeightLoader() {
  cudaStreamSynchronize(stream_);  // queued copies have left the ring buffers
  readers_.reset();
  for (auto& kv : files_) close(kv.second);
  for (cudaEvent_t e : ring_done_)
    if (e) cudaEventDestroy(e);
}

void WeightLoader::load(uint16_t* dest, const std::string& path, int64_t file_offset,
                        int64_t nbytes, int dtype, int64_t numel) {
  const size_t es = dtype_size(dtype);
  HEARTH_REQUIRE(nbytes == numel * (int64_t)es, "tensor byte size disagrees with its shape");
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
  const int64_t chunk_elems = (int64_t)(kStagingBytes / es);
  for (int64_t done = 0; done < numel; done += chunk_elems) {
    const int64_t n = std::min(chunk_elems, numel - done);
    const int slot = ring_next_;
    ring_next_ = (ring_next_ + 1) % kRing;
    HEARTH_CUDA(cudaEventSynchronize(ring_done_[slot]));  // its previous copy has left the buffer
    char* host = ring_[slot].as<char>();
    readers_->read(it->second, file_offset + done * (int64_t)es, host, (size_t)(n * es), path);
    uint16_t* out = dest + done;
    if (dtype == 0) {
      HEARTH_CUDA(cudaMemcpyAsync(out, host, n * es, cudaMemcpyHostToDevice, stream_));
    } else {
      if (!ring_scratch_[slot].get()) ring_scratch_[slot] = DeviceBuffer(kStagingBytes, "load staging");
      HEARTH_CUDA(cudaMemcpyAsync(ring_scratch_[slot].get(), host, n * es, cudaMemcpyHostToDevice, stream_));
      launch_convert_to_bf16(ring_scratch_[slot].get(), dtype, reinterpret_cast<bf16*>(out), n, stream_);
    }
    HEARTH_CUDA(cudaEventRecord(ring_done_[slot], stream_));
  }
}

}  // namespace hearth
