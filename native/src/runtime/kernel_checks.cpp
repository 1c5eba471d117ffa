// Kernel test entry points: pointer casts, one launcher, a synchronize. No math.
#include "kernel_checks.h"

#include <algorithm>
#include <functional>

#include "../kernels/gemv_params.cuh"
#include "device_memory.h"

namespace hearth::checks {

namespace {
template <typename T> T* P(uintptr_t p) { return reinterpret_cast<T*>(p); }
void sync() { HEARTH_CUDA(cudaDeviceSynchronize()); }
WeightView view(uintptr_t w, bool fp16, float scale) {
  return WeightView{P<const void>(w), fp16 ? WeightFormat::Fp16 : WeightFormat::Bf16, scale};
}
}  // namespace

void embedding(uintptr_t ids, int tokens, uintptr_t table, int vocab, int hidden, uintptr_t out,
               bool fp16, float scale) {
  launch_embedding(P<const int32_t>(ids), tokens, view(table, fp16, scale), vocab, hidden,
                   P<float>(out), 0);
  sync();
}

void rmsnorm_residual(uintptr_t residual, uintptr_t delta, uintptr_t weight, uintptr_t out,
                      int rows, int hidden, float eps, uintptr_t delta_row_scale, uintptr_t out16,
                      float out16_scale) {
  launch_rmsnorm_residual(P<float>(residual), P<const float>(delta), P<const bf16>(weight),
                          P<float>(out), rows, hidden, eps, 0, P<const float>(delta_row_scale),
                          P<f16>(out16), out16_scale);
  sync();
}

void add_bias(uintptr_t x, uintptr_t bias, int rows, int cols) {
  launch_add_bias(P<float>(x), P<const bf16>(bias), rows, cols, 0);
  sync();
}

void head_rmsnorm(uintptr_t x, int rows, int row_stride, int col0, int heads, int head_dim,
                  uintptr_t weight, float eps) {
  launch_head_rmsnorm(P<float>(x), rows, row_stride, col0, heads, head_dim, P<const bf16>(weight), eps, 0);
  sync();
}

std::vector<float> rope_inv_freq(const ModelConfig& config) { return hearth::rope_inv_freq(config); }

void rope_kv_write(uintptr_t qkv, int tokens, int heads, int kv_heads, int head_dim,
                   uintptr_t positions, uintptr_t slots, uintptr_t inv_freq, uintptr_t q_out,
                   uintptr_t k_cache, uintptr_t v_cache, uintptr_t q_norm, uintptr_t k_norm, float eps) {
  const RopeTarget target{P<const int32_t>(positions), P<const int32_t>(slots),
                          P<const float>(inv_freq), P<float>(q_out), P<bf16>(k_cache),
                          P<bf16>(v_cache), heads, kv_heads, head_dim};
  launch_rope_kv_write(P<const float>(qkv), tokens, target, 0, HeadNorm{P<const bf16>(q_norm), P<const bf16>(k_norm), eps});
  sync();
}

void paged_attention(const std::string& mode, uintptr_t q, uintptr_t k_cache, uintptr_t v_cache,
                     uintptr_t block_tables, uintptr_t row_table, uintptr_t kv_lens, uintptr_t out,
                     int rows, int heads, int kv_heads, int head_dim, int block_size,
                     int max_blocks, float scale, int split_len) {
  PagedAttention p{P<const float>(q), P<const bf16>(k_cache), P<const bf16>(v_cache),
                   P<const int32_t>(block_tables), P<const int32_t>(row_table),
                   P<const int32_t>(kv_lens), P<float>(out), rows, heads, kv_heads, head_dim,
                   block_size, max_blocks, scale};
  if (mode == "prefill") {
    launch_prefill_attention(p, 0);
  } else if (mode == "prefill_tc" || mode == "prefill_tc1") {
    launch_prefill_attention_tc(p, 0, 1, nullptr, nullptr, mode == "prefill_tc");
  } else if (mode == "prefill_tc_ksplit" || mode == "prefill_tc1_ksplit") {
    // split_len here = the number of key splits (forced; the model picks it by prefill_key_splits)
    const int splits = split_len;
    DeviceBuffer ml((size_t)splits * rows * heads * 2 * 4, "prefill partials");
    DeviceBuffer acc((size_t)splits * rows * heads * head_dim * 4, "prefill partials");
    launch_prefill_attention_tc(p, 0, splits, ml.as<float>(), acc.as<float>(), mode == "prefill_tc_ksplit");
    sync();
  } else if (mode == "prefill_scalar") {
    launch_prefill_attention_scalar(p, 0);
  } else if (mode == "decode") {
    const int max_splits = 32;  // split_len * 32 must cover the longest row
    DeviceBuffer ml((size_t)rows * heads * max_splits * 2 * 4, "attention partials");
    DeviceBuffer acc((size_t)rows * heads * max_splits * head_dim * 4, "attention partials");
    DeviceBuffer counters((size_t)rows * heads * 4, "attention counters");
    HEARTH_CUDA(cudaMemset(counters.get(), 0, counters.bytes()));
    launch_decode_attention(p, split_len, max_splits, ml.as<float>(), acc.as<float>(),
                            counters.as<int>(), 0);
    // Twice: the counters the first launch left must serve the next one.
    launch_decode_attention(p, split_len, max_splits, ml.as<float>(), acc.as<float>(),
                            counters.as<int>(), 0);
    sync();
  } else {
    throw std::invalid_argument("paged_attention: mode must be decode, prefill, prefill_tc(1), prefill_tc(1)_ksplit or prefill_scalar");
  }
  sync();
}

void swiglu(uintptr_t gate_up, uintptr_t out, int rows, int inter, uintptr_t out16,
            uintptr_t row_scale) {
  launch_swiglu(P<const float>(gate_up), P<float>(out), rows, inter, 0, P<f16>(out16),
                P<float>(row_scale));
  sync();
}

void gemv_fused(uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k,
                uintptr_t norm_weight, uintptr_t norm_partials, int norm_count, float eps,
                uintptr_t residual_partials, bool fp16, float w_scale) {
  const GemvNorm norm{P<const bf16>(norm_weight), P<const float>(norm_partials), norm_count, eps};
  const GemvResidual residual{P<float>(residual_partials)};
  launch_gemv(P<const float>(x), view(w, fp16, w_scale), P<float>(out), rows, n, k, 0,
              norm_weight ? &norm : nullptr, residual_partials ? &residual : nullptr);
  sync();
}

static WeightView nvfp4_view(uintptr_t codes, uintptr_t block_scales, float global_scale) {
  WeightView w;
  w.data = P<const void>(codes);
  w.format = WeightFormat::NvFp4;
  w.scale = global_scale;
  w.block_scales = P<const uint8_t>(block_scales);
  return w;
}

static GemvParams nvfp4_params(uintptr_t x, uintptr_t codes, float global_scale, uintptr_t out, int n, int k) {
  return GemvParams{P<const float>(x), P<const void>(codes), global_scale, P<float>(out), n, k, nullptr, nullptr,
                    0, 0.f, nullptr, {}};
}

void gemv_nvfp4(uintptr_t x, uintptr_t codes, uintptr_t block_scales, float global_scale,
                uintptr_t out, int rows, int n, int k, bool fast, float x_scale, uintptr_t x_amax,
                int x_amax_count) {
  GemvParams prm = nvfp4_params(x, codes, global_scale, out, n, k);
  prm.fast = fast;
  prm.x_scale = x_scale;
  prm.x_amax = P<const float>(x_amax);
  prm.x_amax_count = x_amax_count;
  launch_gemv_nvfp4(prm, P<const uint8_t>(block_scales), rows, 0, 0);
  sync();
}

void gemm_nvfp4(uintptr_t x16, float x_scale, uintptr_t codes, uintptr_t block_scales, float global_scale,
                uintptr_t out, int rows, int n, int k) {
  launch_gemm_nvfp4(Fp16Operand{P<const f16>(x16), x_scale, nullptr}, nvfp4_view(codes, block_scales, global_scale),
                    P<float>(out), rows, n, k, 0);
  sync();
}

void nvfp4_expand(uintptr_t codes, uintptr_t block_scales, uintptr_t out, int n, int k, bool fp16) {
  launch_nvfp4_expand(nvfp4_view(codes, block_scales, 1.f), n, k, P<void>(out), fp16, 0);
  sync();
}

bool gemv_swiglu(uintptr_t x, uintptr_t w_gate_up, uintptr_t out, int rows, int inter, int k) {
  if (!gemv_swiglu_supported(rows, inter, k)) return false;
  launch_gemv_swiglu(P<const float>(x), view(w_gate_up, false, 1.f), P<float>(out), rows, inter, k, 0);
  sync();
  return true;
}

void matmul(const std::string& path, uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k) {
  const WeightView wv = view(w, false, 1.f);
  if (path == "gemv") {
    launch_gemv(P<const float>(x), wv, P<float>(out), rows, n, k, 0);
  } else if (path == "gemm" || path == "tiled") {
    DeviceBuffer ws(kLtWorkspaceBytes, "cuBLASLt workspace");
    DeviceBuffer split((size_t)rows * k * 2 * 2, "activation split");
    // No split buffer: the tiled kernel.
    const GemmWork work{path == "gemm" ? split.as<bf16>() : nullptr, ws.get(), ws.bytes()};
    launch_gemm_exact(P<const float>(x), wv, P<float>(out), rows, n, k, work, 0);
  } else {
    throw std::invalid_argument("matmul: path must be gemv, gemm or tiled");
  }
  sync();
}

void gemm_fast(uintptr_t x16, float x_scale, uintptr_t w16, float w_scale, uintptr_t out, int rows,
               int n, int k) {
  DeviceBuffer ws(kLtWorkspaceBytes, "cuBLASLt workspace");
  const GemmWork work{nullptr, ws.get(), ws.bytes()};
  launch_gemm_fast(Fp16Operand{P<const f16>(x16), x_scale, nullptr}, view(w16, true, w_scale),
                   P<float>(out), rows, n, k, work, 0);
  sync();
}

void convert_to_f16(uintptr_t src, uintptr_t dst, int64_t count, float scale) {
  launch_convert_to_f16(P<const float>(src), P<f16>(dst), count, scale, 0);
  sync();
}

float amax_bf16(uintptr_t x, int64_t count) {
  DeviceBuffer d(4, "amax");
  HEARTH_CUDA(cudaMemset(d.get(), 0, 4));
  launch_amax_bf16(P<const bf16>(x), count, d.as<float>(), 0);
  float out = 0.f;
  HEARTH_CUDA(cudaMemcpy(&out, d.get(), 4, cudaMemcpyDeviceToHost));
  return out;
}

void bf16_to_f16_inplace(uintptr_t data, int64_t count, float scale) {
  launch_bf16_to_f16_inplace(P<void>(data), count, scale, 0);
  sync();
}

void decode_attention_launch(uintptr_t q, uintptr_t k_cache, uintptr_t v_cache,
                             uintptr_t block_tables, uintptr_t row_table, uintptr_t kv_lens,
                             uintptr_t out, int rows, int heads, int kv_heads, int head_dim,
                             int block_size, int max_blocks, float scale, uintptr_t part_ml,
                             uintptr_t part_acc, uintptr_t counters) {
  PagedAttention p{P<const float>(q), P<const bf16>(k_cache), P<const bf16>(v_cache),
                   P<const int32_t>(block_tables), P<const int32_t>(row_table),
                   P<const int32_t>(kv_lens), P<float>(out), rows, heads, kv_heads, head_dim,
                   block_size, max_blocks, scale};
  launch_decode_attention(p, 0, 32, P<float>(part_ml), P<float>(part_acc), P<int>(counters), 0);
}

// Seconds per call of `launch(i)` (copy i % copies of the weights), `reps` calls back to back.
static double seconds_per(int copies, int reps, const std::function<void(int)>& launch) {
  HEARTH_REQUIRE(copies > 0 && reps > 0, "seconds: copies and reps must be positive");
  cudaEvent_t start, stop;
  HEARTH_CUDA(cudaEventCreate(&start));
  HEARTH_CUDA(cudaEventCreate(&stop));
  launch(0);  // warm-up
  HEARTH_CUDA(cudaEventRecord(start, 0));
  for (int i = 0; i < reps; ++i) launch(i % copies);
  HEARTH_CUDA(cudaEventRecord(stop, 0));
  HEARTH_CUDA(cudaEventSynchronize(stop));
  float ms = 0.f;
  HEARTH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / reps;
}

double gemv_seconds(uintptr_t x, uintptr_t w, uintptr_t out, int rows, int n, int k, int copies,
                    int reps) {
  const bf16* base = P<const bf16>(w);
  return seconds_per(copies, reps, [&](int i) {
    launch_gemv(P<const float>(x), WeightView{base + (size_t)i * n * k, WeightFormat::Bf16, 1.f}, P<float>(out), rows,
                n, k, 0);
  });
}

double gemv_nvfp4_seconds(uintptr_t x, uintptr_t codes, uintptr_t block_scales, uintptr_t out, int rows,
                          int n, int k, int copies, int reps, bool fast) {
  const uint8_t* c = P<const uint8_t>(codes);
  const uint8_t* s = P<const uint8_t>(block_scales);
  return seconds_per(copies, reps, [&](int i) {
    GemvParams prm = nvfp4_params(x, reinterpret_cast<uintptr_t>(c + (size_t)i * n * (k / 2)), 1.f, out, n, k);
    prm.fast = fast;
    launch_gemv_nvfp4(prm, s + (size_t)i * n * (k / 16), rows, 0, 0);
  });
}

double gemm_nvfp4_seconds(uintptr_t x16, uintptr_t codes, uintptr_t block_scales, uintptr_t out, int rows, int n,
                          int k, int copies, int reps, bool expand) {
  const uint8_t* c = P<const uint8_t>(codes);
  const uint8_t* s = P<const uint8_t>(block_scales);
  DeviceBuffer expanded(expand ? (size_t)n * k * 2 : 16, "nvfp4 expansion");
  DeviceBuffer lt(kLtWorkspaceBytes, "cuBLASLt workspace");
  const Fp16Operand op{P<const f16>(x16), 1.f, nullptr};
  return seconds_per(copies, reps, [&](int i) {
    const WeightView w = nvfp4_view(reinterpret_cast<uintptr_t>(c + (size_t)i * n * (k / 2)),
                                    reinterpret_cast<uintptr_t>(s + (size_t)i * n * (k / 16)), 1.f);
    if (expand) {
      const WeightView w16 = launch_nvfp4_expand(w, n, k, expanded.get(), true, 0);
      launch_gemm_fast(op, w16, P<float>(out), rows, n, k, GemmWork{nullptr, lt.get(), lt.bytes()}, 0);
    } else {
      launch_gemm_nvfp4(op, w, P<float>(out), rows, n, k, 0);
    }
  });
}

void convert_to_bf16(uintptr_t src, int src_dtype, uintptr_t dst, int64_t count) {
  launch_convert_to_bf16(P<const void>(src), src_dtype, P<bf16>(dst), count, 0);
  sync();
}

std::vector<int32_t> sample(uintptr_t logits, int rows, int vocab,
                            const std::vector<SampleRequest>& requests) {
  HEARTH_REQUIRE((int)requests.size() == rows, "sample: one request per row");
  std::vector<SampleRow> params;
  std::vector<int32_t> history;
  build_sample_rows(requests, vocab, &params, &history);
  DeviceBuffer d_params(rows * sizeof(SampleRow), "sampler");
  DeviceBuffer d_hist(std::max<size_t>(history.size() * 4, 4), "sampler");
  DeviceBuffer d_work((size_t)rows * vocab * 4, "sampler");
  DeviceBuffer d_tokens((size_t)rows * 4, "sampler");
  HEARTH_CUDA(cudaMemcpy(d_params.get(), params.data(), rows * sizeof(SampleRow), cudaMemcpyHostToDevice));
  if (!history.empty())
    HEARTH_CUDA(cudaMemcpy(d_hist.get(), history.data(), history.size() * 4, cudaMemcpyHostToDevice));
  launch_sample(P<const float>(logits), rows, vocab, d_params.as<SampleRow>(),
                d_hist.as<int32_t>(), d_work.as<float>(), d_tokens.as<int32_t>(), 0);
  std::vector<int32_t> out(rows);
  HEARTH_CUDA(cudaMemcpy(out.data(), d_tokens.get(), rows * 4, cudaMemcpyDeviceToHost));
  return out;
}

namespace {
MoeExperts moe_experts(const MoeExpertPointers& p, int experts, int inter, int hidden, bool nvfp4) {
  MoeExperts ex;
  ex.experts = experts, ex.inter = inter, ex.hidden = hidden;
  const WeightFormat format = nvfp4 ? WeightFormat::NvFp4 : WeightFormat::Bf16;
  ex.gate_up = WeightView{P<const void>(p.gate_up), format, 1.f, P<const uint8_t>(p.gate_up_block_scales)};
  ex.down = WeightView{P<const void>(p.down), format, 1.f, P<const uint8_t>(p.down_block_scales)};
  ex.gate_up_scales = nvfp4 ? P<const float>(p.gate_up_scales) : nullptr;
  ex.down_scales = nvfp4 ? P<const float>(p.down_scales) : nullptr;
  return ex;
}
}  // namespace

std::pair<std::vector<int32_t>, std::vector<float>> moe_route(uintptr_t resid, uintptr_t norm_partials, int norm_count,
                                                              uintptr_t norm_weight, float eps, uintptr_t router,
                                                              int router_rows, int rows, int hidden, int experts,
                                                              int top_k, bool normalize, uintptr_t xn) {
  const int pairs = rows * top_k;
  DeviceBuffer logits((size_t)rows * router_rows * 4 + 4, "moe logits"), experts_out(pairs * 4 + 4, "moe pairs"),
      weights(pairs * 4 + 4, "moe weights"), counters((size_t)rows * 4 + 4, "moe counters");
  HEARTH_CUDA(cudaMemset(counters.get(), 0, counters.bytes()));
  const MoeRoute r{P<const float>(resid), P<const float>(norm_partials), norm_count, P<const bf16>(norm_weight), eps,
                   P<const bf16>(router), router_rows, hidden, experts, top_k, normalize ? 1 : 0, router_rows,
                   P<float>(xn), logits.as<float>(), experts_out.as<int32_t>(), weights.as<float>(),
                   counters.as<int>()};
  for (int rep = 0; rep < 2; ++rep) launch_moe_route(r, rows, 0);  // twice: the counters were left zero
  sync();
  std::vector<int32_t> chosen(pairs);
  std::vector<float> chosen_weights(pairs);
  HEARTH_CUDA(cudaMemcpy(chosen.data(), experts_out.get(), pairs * 4, cudaMemcpyDeviceToHost));
  HEARTH_CUDA(cudaMemcpy(chosen_weights.data(), weights.get(), pairs * 4, cudaMemcpyDeviceToHost));
  return {chosen, chosen_weights};
}

std::pair<std::vector<int32_t>, std::vector<float>> moe_block(const MoeCheck& c) {
  HEARTH_REQUIRE(c.path == "gemv" || c.path == "grouped" || c.path == "tiled" || c.path == "grouped_nvfp4",
                 "moe_block: path is 'gemv', 'grouped', 'tiled' or 'grouped_nvfp4'");
  const int pairs = c.rows * c.top_k, stride = c.experts + (c.shared_inter > 0 ? 1 : 0);
  const int widest = std::max(c.inter * c.top_k, c.shared_inter);
  DeviceBuffer logits((size_t)c.rows * stride * 4 + 4, "moe logits"), experts(pairs * 4 + 4, "moe pairs"),
      weights(pairs * 4 + 4, "moe weights"), act((size_t)c.rows * widest * 4 + 4, "moe act"),
      y((size_t)pairs * c.hidden * 4 + 4, "moe y"), shared_y((size_t)c.rows * c.hidden * 4 + 4, "moe shared y"),
      sorted(pairs * 4 + 4, "moe sorted"),
      tiles((1 + 3 * (size_t)moe_max_tiles(pairs, c.experts, kMoeGemvTileRows)) * 4, "moe tiles");
  const MoeExperts routed = moe_experts(c.routed, c.experts, c.inter, c.hidden, c.nvfp4);
  const float* x = P<const float>(c.x);
  auto run = [&](const MoeExperts& ex, const int32_t* pair_expert, int n, int top_k, float* out) {
    if (c.path == "gemv") {
      launch_moe_expert_gemv(x, ex, pair_expert, n, top_k, true, act.as<float>(), 0);
      launch_moe_expert_gemv(act.as<float>(), ex, pair_expert, n, 1, false, out, 0);
    } else if (c.path == "grouped_nvfp4") {  // fast: the rows as fp16 (scale 1), act as fp16
      DeviceBuffer x16((size_t)c.rows * c.hidden * 2 + 16, "moe x16");
      launch_convert_to_f16(x, x16.as<f16>(), (int64_t)c.rows * c.hidden, 1.f, 0);
      const int tile_rows = c.rows <= kMoeTiledMaxRows ? kMoeGemvTileRows : kMoeTileRows;  // as the engine
      const int max_tiles = moe_max_tiles(n, ex.experts, tile_rows);
      launch_moe_sort(pair_expert, n, ex.experts, tile_rows, sorted.as<int32_t>(), tiles.as<int32_t>(), 0);
      f16* act16 = reinterpret_cast<f16*>(act.as<float>());
      launch_moe_grouped_nvfp4(x16.as<f16>(), 1.f, ex, sorted.as<int32_t>(), tiles.as<int32_t>(), max_tiles,
                               tile_rows, top_k, true, act16, nullptr, 0);
      launch_moe_grouped_nvfp4(act16, 1.f, ex, sorted.as<int32_t>(), tiles.as<int32_t>(), max_tiles, tile_rows, 1,
                               false, nullptr, out, 0);
      sync();
    } else if (c.path == "tiled") {
      const int max_tiles = moe_max_tiles(n, ex.experts, kMoeGemvTileRows);
      launch_moe_sort(pair_expert, n, ex.experts, kMoeGemvTileRows, sorted.as<int32_t>(), tiles.as<int32_t>(), 0);
      const int32_t* st = sorted.as<int32_t>();
      const int32_t* tl = tiles.as<int32_t>();
      launch_moe_expert_tiles(x, ex, st, tl, max_tiles, top_k, true, act.as<float>(), 0);
      launch_moe_expert_tiles(act.as<float>(), ex, st, tl, max_tiles, 1, false, out, 0);
    } else {
      const int max_tiles = moe_max_tiles(n, ex.experts, kMoeTileRows);
      launch_moe_sort(pair_expert, n, ex.experts, kMoeTileRows, sorted.as<int32_t>(), tiles.as<int32_t>(), 0);
      launch_moe_grouped(x, ex, sorted.as<int32_t>(), tiles.as<int32_t>(), max_tiles, top_k, true, c.split,
                         act.as<float>(), 0);
      launch_moe_grouped(act.as<float>(), ex, sorted.as<int32_t>(), tiles.as<int32_t>(), max_tiles, 1, false,
                         c.split, out, 0);
    }
  };
  launch_moe_router(x, P<const bf16>(c.router), logits.as<float>(), c.rows, stride, c.hidden, 0);
  launch_moe_top_k(logits.as<float>(), c.rows, stride, c.experts, c.top_k, c.normalize,
                   experts.as<int32_t>(), weights.as<float>(), 0);
  run(routed, experts.as<int32_t>(), pairs, c.top_k, y.as<float>());
  if (c.shared_inter > 0)
    run(moe_experts(c.shared, 1, c.shared_inter, c.hidden, c.nvfp4), nullptr, c.rows, 1, shared_y.as<float>());
  launch_moe_combine(P<float>(c.resid), y.as<float>(), weights.as<float>(), c.rows, c.top_k, c.hidden,
                     c.shared_inter > 0 ? shared_y.as<float>() : nullptr, logits.as<float>() + c.experts,
                     stride, nullptr, 0);
  sync();
  std::vector<int32_t> chosen(pairs);
  std::vector<float> chosen_weights(pairs);
  HEARTH_CUDA(cudaMemcpy(chosen.data(), experts.get(), pairs * 4, cudaMemcpyDeviceToHost));
  HEARTH_CUDA(cudaMemcpy(chosen_weights.data(), weights.get(), pairs * 4, cudaMemcpyDeviceToHost));
  return {chosen, chosen_weights};
}

}  // namespace hearth::checks
