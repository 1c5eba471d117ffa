// The layer pipeline: embedding -> per layer an attention block (norm, fused qkv, [bias], [q/k
// norm], rope + KV write, paged attention, o) then a feed-forward block (norm, fused gate/up,
// SwiGLU, down; or the mixture-of-experts block where the layer routes) -> final norm -> logits.
//
// The layer loop names blocks; blocks name projections with their prologue (the RMSNorm of the
// residual stream) and epilogue (rope, SwiGLU, the residual add); the projection picks its kernels
// from the row count and the weight format, here and nowhere else:
//   - GemvFused (<= 4 rows): GEMVs carry the norm (o / down add into the residual stream and leave
//     its sums of squares, the next GEMV normalizes on the fly), rope + KV write (qkv) and SwiGLU
//     (gate/up): a layer is 5 kernels;
//   - Gemv (5-8 rows): the RMSNorm kernel, then GEMVs (gate/up still with its SwiGLU epilogue);
//   - Gemm (more rows): the RMSNorm kernel writes the product's input (fp32 for exact, the scaled
//     fp16 operand for fast), cuBLASLt multiplies (NVFP4 weights: expanded into 16 bits first, or,
//     fast and up to 64 rows, gemm_nvfp4.cu reading the codes in place), separate rope / SwiGLU
//     kernels follow. A residual projection leaves its output for the next norm to add.
// A feed-forward kind is a block: feed_forward_block (dense SwiGLU) or moe_block (mixture of
// experts, moe.cu: router, top-k, expert GEMVs for few rows or a sorted grouped GEMM for many,
// the weighted sum added into the residual stream; NVFP4 experts at the fast precision: the grouped
// product on mma.sync over codes read in place); a new weight format is one more WeightFormat
// the projections (and the expert kernels) dispatch on.
#include <cmath>

#include "model.h"

namespace hearth {

enum class RowPath { GemvFused, Gemv, Gemm };

struct Model::Pass {
  int T;
  RowPath path;
  bool decode;
  int table_stride;
  const int32_t *ids, *positions, *slots, *kv_lens, *row_table, *tables;
  bool fast;
  GemmWork gemm;
};

// What the residual stream still owes: Gemv / Gemm paths leave a residual projection's output in
// `delta` for the next norm to add (times `delta_row_scale` per row where the product ran over a
// row-scaled operand); the GemvFused path adds in place and leaves `norm_count` per-block sums of
// squares per row in norm_parts_.
struct Model::Residual {
  const float* delta = nullptr;
  const float* delta_row_scale = nullptr;
  int norm_count = 1;
};

// The input of a projection that is not a norm's output: fp32 rows, or (fast Gemm path) the
// fp16 operand a producer already wrote; from a fast NVFP4 SwiGLU GEMV, also its rows' per-block
// max |y| (amax [rows, amax_count]) for the down GEMV's fp16 operand.
struct Model::Activation {
  const float* f32 = nullptr;
  Fp16Operand f16;
  const float* amax = nullptr;
  int amax_count = 0;
};

// Between the qkv product and attention: bias, q / k norms, rope + KV write.
struct Model::RopeEpilogue {
  RopeTarget target;
  const bf16* bias;
  const bf16* q_norm;
  const bf16* k_norm;
};

namespace {

// A call's path: a GEMM pass still takes GEMVs for the few rows of its logits.
RowPath path_for(RowPath pass_path, int rows) {
  return pass_path == RowPath::Gemm && rows <= kGemvMaxRows ? RowPath::Gemv : pass_path;
}

}  // namespace

Model::Activation Model::project_normed(const Pass& pass, Residual& res, const bf16* norm_weight,
                                        float norm_scale, const Linear& proj, float* out, int row0,
                                        int rows, const RopeEpilogue* rope, bool swiglu) {
  const int H = cfg_.hidden;
  const float eps = cfg_.rms_eps;
  float* x = resid_ + (size_t)row0 * H;
  const RowPath path = path_for(pass.path, rows);
  const int inter = proj.n / 2;  // swiglu: gate rows then up rows
  // The fast GEMV's operand (NVFP4 weights): a normalized row is bounded by norm_scale; a SwiGLU
  // product leaves its rows' max |y| for the down product.
  GemvFast fast{norm_scale};
  const GemvFast* fast_gemv = pass.fast ? &fast : nullptr;
  auto swiglu_output = [&] {
    Activation a{gate_up_, {}};
    if (fast_gemv && gemv_amax_) a.amax = gemv_amax_, a.amax_count = gemv_blocks(rows, proj.n, proj.k, proj.w.format);
    return a;
  };
  if (fast_gemv && swiglu) fast.amax_out = gemv_amax_;
  if (path == RowPath::GemvFused) {
    const GemvNorm norm{norm_weight, norm_parts_ + (size_t)row0 * res.norm_count, res.norm_count, eps};
    if (rope && !rope->bias && !rope->q_norm && gemv_rope_supported(rows, proj.n, proj.k, proj.w.format)) {
      launch_gemv_rope(x, proj.w, rows, proj.n, proj.k, stream_, norm, rope->target, fast_gemv);
      return {};
    }
    if (swiglu && gemv_swiglu_supported(rows, inter, proj.k, proj.w.format)) {
      launch_gemv_swiglu(x, proj.w, gate_up_, rows, inter, proj.k, stream_, &norm, fast_gemv);
      return swiglu_output();
    }
    launch_gemv(x, proj.w, out, rows, proj.n, proj.k, stream_, &norm, nullptr, fast_gemv);
  } else {
    // The norm kernel adds what the residual stream is owed, then writes the product's input.
    const float* delta = res.delta ? res.delta + (size_t)row0 * H : nullptr;
    const float* delta_scale = res.delta_row_scale ? res.delta_row_scale + row0 : nullptr;
    const bool fp16_operand = path == RowPath::Gemm && pass.fast;
    launch_rmsnorm_residual(x, delta, norm_weight, fp16_operand ? nullptr : xn_, rows, H, eps,
                            stream_, delta_scale, fp16_operand ? op16_ : nullptr, norm_scale);
    if (row0 == 0 && rows == pass.T) res.delta = nullptr, res.delta_row_scale = nullptr;
    if (path == RowPath::Gemv) {
      if (swiglu && gemv_swiglu_supported(rows, inter, proj.k, proj.w.format)) {
        launch_gemv_swiglu(xn_, proj.w, gate_up_, rows, inter, proj.k, stream_, nullptr, fast_gemv);
        return swiglu_output();
      }
      launch_gemv(xn_, proj.w, out, rows, proj.n, proj.k, stream_, nullptr, nullptr, fast_gemv);
    } else if (pass.fast) {
      product_fast(pass, Fp16Operand{op16_, norm_scale, nullptr}, proj, out, rows);
    } else {
      launch_gemm_exact(xn_, gemm_weight(pass, proj), out, rows, proj.n, proj.k, pass.gemm, stream_);
    }
  }
  if (swiglu) {
    if (path == RowPath::Gemm && pass.fast) {
      launch_swiglu(out, nullptr, rows, inter, stream_, op16_, row_scale_);
      return Activation{nullptr, Fp16Operand{op16_, 1.f, row_scale_}};
    }
    launch_swiglu(out, xn_, rows, inter, stream_);
    return Activation{xn_, {}};
  }
  if (rope) {
    if (rope->bias) launch_add_bias(out, rope->bias, rows, qkv_size_, stream_);
    HeadNorm head_norm;
    if (rope->q_norm && cfg_.qk_norm_whole) {  // OLMoE: one norm over all of q, one over all of k
      launch_head_rmsnorm(out, rows, qkv_size_, 0, 1, q_size_, rope->q_norm, eps, stream_);
      launch_head_rmsnorm(out, rows, qkv_size_, q_size_, 1, kv_size_, rope->k_norm, eps, stream_);
    } else if (rope->q_norm) {  // Qwen3: per head, inside the rope kernel
      head_norm = HeadNorm{rope->q_norm, rope->k_norm, eps};
    }
    launch_rope_kv_write(out, rows, rope->target, stream_, head_norm);
  }
  return {};
}

void Model::project_into_residual(const Pass& pass, Residual& res, const Linear& proj,
                                  const Activation& in) {
  const int T = pass.T;
  // The fast GEMV's operand: SwiGLU rows by their max |y|; attention's output is bounded by max |v|.
  const GemvFast fast{1.f, in.amax, in.amax_count};
  const GemvFast* fast_gemv = pass.fast ? &fast : nullptr;
  switch (pass.path) {
    case RowPath::GemvFused: {
      const GemvResidual into{norm_parts_};
      launch_gemv(in.f32, proj.w, resid_, T, proj.n, proj.k, stream_, nullptr, &into, fast_gemv);
      res.norm_count = gemv_blocks(T, proj.n, proj.k, proj.w.format);
      return;
    }
    case RowPath::Gemv:
      launch_gemv(in.f32, proj.w, delta_, T, proj.n, proj.k, stream_, nullptr, nullptr, fast_gemv);
      res.delta = delta_;
      res.delta_row_scale = nullptr;
      return;
    case RowPath::Gemm:
      if (pass.fast) {
        Fp16Operand op = in.f16;
        if (!op.data) {  // attention's fp32 output: bounded by max |v|, no scale needed
          launch_convert_to_f16(in.f32, op16_, (int64_t)T * proj.k, 1.f, stream_);
          op = Fp16Operand{op16_, 1.f, nullptr};
        }
        product_fast(pass, op, proj, delta_, T);
        res.delta_row_scale = op.row_scale;
      } else {
        launch_gemm_exact(in.f32, gemm_weight(pass, proj), delta_, T, proj.n, proj.k, pass.gemm, stream_);
        res.delta_row_scale = nullptr;
      }
      res.delta = delta_;
      return;
  }
}

void Model::product_fast(const Pass& pass, const Fp16Operand& x, const Linear& proj, float* out, int rows) {
  if (proj.w.format == WeightFormat::NvFp4 && rows <= kGemmNvfp4MaxRows) {  // codes read in place
    launch_gemm_nvfp4(x, proj.w, out, rows, proj.n, proj.k, stream_);
    return;
  }
  launch_gemm_fast(x, gemm_weight(pass, proj), out, rows, proj.n, proj.k, pass.gemm, stream_);
}

WeightView Model::gemm_weight(const Pass& pass, const Linear& proj) {
  if (proj.w.format != WeightFormat::NvFp4) return proj.w;
  return launch_nvfp4_expand(proj.w, proj.n, proj.k, nvfp4_expanded_, pass.fast, stream_);
}

void Model::attention_block(const Pass& pass, Residual& res, int layer) {
  const LayerWeights& lw = weights_.layers[layer];
  const int hd = cfg_.head_dim;
  bf16* k_cache = kv_.as<bf16>() + (size_t)(2 * layer) * kv_layer_elems_;
  bf16* v_cache = k_cache + kv_layer_elems_;
  const RopeEpilogue rope{RopeTarget{pass.positions, pass.slots, inv_freq_, q_, k_cache, v_cache,
                                     cfg_.heads, cfg_.kv_heads, hd},
                          lw.bqkv, lw.q_norm, lw.k_norm};
  project_normed(pass, res, lw.attn_norm, lw.attn_norm_scale, lw.qkv, qkv_, 0, pass.T, &rope, false);
  const PagedAttention att{q_, k_cache, v_cache, pass.tables, pass.row_table, pass.kv_lens, xn_,
                           pass.T, cfg_.heads, cfg_.kv_heads, hd, cache_.block_size,
                           pass.table_stride, 1.f / std::sqrt((float)hd)};
  if (pass.decode) {
    launch_decode_attention(att, 0, kMaxSplits, part_ml_, part_acc_, attn_counters_, stream_);
  } else {
    const PrefillSplitWork work{part_ml_, part_acc_, part_rows_, step_max_kv_};
    launch_prefill_attention(att, stream_, step_max_kv_ > 0 ? &work : nullptr, !pass.fast);
  }
  project_into_residual(pass, res, lw.o, Activation{xn_, {}});
}

void Model::feed_forward_block(const Pass& pass, Residual& res, int layer) {
  const LayerWeights& lw = weights_.layers[layer];
  const Activation hidden = project_normed(pass, res, lw.mlp_norm, lw.mlp_norm_scale, lw.gate_up,
                                           gate_up_, 0, pass.T, nullptr, true);
  project_into_residual(pass, res, lw.down, hidden);
}

void Model::run_experts(const Pass& pass, const MoeExperts& ex, const int32_t* pair_expert, int pairs,
                        int top_k, float* y, const f16* x16, float x_scale) {
  if (pass.T <= kGemvMaxRows) {  // decode: read only the chosen experts' rows
    launch_moe_expert_gemv(xn_, ex, pair_expert, pairs, top_k, true, moe_act_, stream_);
    launch_moe_expert_gemv(moe_act_, ex, pair_expert, pairs, 1, false, y, stream_);
    return;
  }
  // Up to kMoeTiledMaxRows tokens an expert has a few rows: tiles of 8 read it once per 8 rows.
  const int tile_rows = pass.T <= kMoeTiledMaxRows ? kMoeGemvTileRows : kMoeTileRows;
  if (x16 && moe_tiled_gemv_supported(ex)) {  // fast, NVFP4: codes read in place, one fp16 product
    const int max_tiles = moe_max_tiles(pairs, ex.experts, tile_rows);
    launch_moe_sort(pair_expert, pairs, ex.experts, tile_rows, moe_sorted_, moe_tiles_, stream_);
    f16* act16 = reinterpret_cast<f16*>(moe_act_);
    launch_moe_grouped_nvfp4(x16, x_scale, ex, moe_sorted_, moe_tiles_, max_tiles, tile_rows, top_k, true, act16,
                             nullptr, stream_);
    launch_moe_grouped_nvfp4(act16, 1.f, ex, moe_sorted_, moe_tiles_, max_tiles, tile_rows, 1, false, nullptr, y,
                             stream_);
    return;
  }
  if (pass.T <= kMoeTiledMaxRows && moe_tiled_gemv_supported(ex)) {  // exact, NVFP4: the expert GEMV's tiles
    const int max_tiles = moe_max_tiles(pairs, ex.experts, kMoeGemvTileRows);
    launch_moe_sort(pair_expert, pairs, ex.experts, kMoeGemvTileRows, moe_sorted_, moe_tiles_, stream_);
    launch_moe_expert_tiles(xn_, ex, moe_sorted_, moe_tiles_, max_tiles, top_k, true, moe_act_, stream_);
    launch_moe_expert_tiles(moe_act_, ex, moe_sorted_, moe_tiles_, max_tiles, 1, false, y, stream_);
    return;
  }
  const int max_tiles = moe_max_tiles(pairs, ex.experts, kMoeTileRows);
  launch_moe_sort(pair_expert, pairs, ex.experts, kMoeTileRows, moe_sorted_, moe_tiles_, stream_);
  launch_moe_grouped(xn_, ex, moe_sorted_, moe_tiles_, max_tiles, top_k, true, !pass.fast, moe_act_, stream_);
  launch_moe_grouped(moe_act_, ex, moe_sorted_, moe_tiles_, max_tiles, 1, false, !pass.fast, y, stream_);
}

void Model::moe_block(const Pass& pass, Residual& res, int layer) {
  const LayerWeights& lw = weights_.layers[layer];
  const int T = pass.T, H = cfg_.hidden, E = cfg_.moe_experts, K = cfg_.moe_top_k;
  const bool shared = cfg_.moe_shared_inter > 0;
  const int stride = (int)moe_router_rows(cfg_);  // the experts' logits, then the shared gate's
  if (pass.path == RowPath::GemvFused) {  // the norm from the o GEMV's sums of squares: one kernel
    const MoeRoute route{resid_, norm_parts_, res.norm_count, lw.mlp_norm, cfg_.rms_eps, lw.router, stride, H, E, K,
                         cfg_.moe_normalize ? 1 : 0, stride, xn_, moe_logits_, moe_pair_experts_,
                         moe_pair_weights_, moe_counters_};
    launch_moe_route(route, T, stream_);
  } else {
    launch_rmsnorm_residual(resid_, res.delta, lw.mlp_norm, xn_, T, H, cfg_.rms_eps, stream_,
                            res.delta_row_scale);
    res.delta = nullptr, res.delta_row_scale = nullptr;
    launch_moe_router(xn_, lw.router, moe_logits_, T, stride, H, stream_);
    launch_moe_top_k(moe_logits_, T, stride, E, K, cfg_.moe_normalize, moe_pair_experts_,
                     moe_pair_weights_, stream_);
  }
  // Past the GEMV's rows, fast precision, NVFP4 experts: the normalized rows once as the fp16
  // operand of the grouped products.
  const f16* x16 = nullptr;
  if (T > kGemvMaxRows && pass.fast && op16_ && moe_tiled_gemv_supported(lw.experts)) {
    launch_convert_to_f16(xn_, op16_, (int64_t)T * H, lw.mlp_norm_scale, stream_);
    x16 = op16_;
  }
  run_experts(pass, lw.experts, moe_pair_experts_, T * K, K, moe_y_, x16, lw.mlp_norm_scale);
  if (shared) run_experts(pass, lw.shared, nullptr, T, 1, moe_shared_y_, x16, lw.mlp_norm_scale);
  // The fused GEMV path's next norm reads each row's sums of squares (moe_combine_blocks partials).
  launch_moe_combine(resid_, moe_y_, moe_pair_weights_, T, K, H, shared ? moe_shared_y_ : nullptr,
                     moe_logits_ + E, stride, pass.path == RowPath::GemvFused ? norm_parts_ : nullptr,
                     stream_);
  res.norm_count = moe_combine_blocks(H);
}

void Model::run_layers(int T, int table_stride, bool decode_mode, int logit_first, int logit_count) {
  const int H = cfg_.hidden, I = cfg_.intermediate;
  const bool gemv_shapes = H % 8 == 0 && q_size_ % 8 == 0 && I % 8 == 0;
  Pass pass;
  pass.T = T;
  pass.path = gemv_shapes && T <= kGemvNormMaxRows ? RowPath::GemvFused
              : gemv_shapes && T <= kGemvMaxRows   ? RowPath::Gemv
                                                   : RowPath::Gemm;
  pass.decode = decode_mode;
  pass.table_stride = table_stride;
  pass.ids = meta_;
  pass.positions = meta_ + T;
  pass.slots = meta_ + 2 * T;
  pass.kv_lens = meta_ + 3 * T;
  pass.row_table = meta_ + 4 * T;
  pass.tables = meta_ + 5 * T;
  pass.fast = cfg_.precision == Precision::Fast;
  pass.gemm = GemmWork{split_, lt_workspace_, kLtWorkspaceBytes};

  launch_embedding(pass.ids, T, weights_.embed.w, cfg_.vocab, H, resid_, stream_,
                   pass.path == RowPath::GemvFused ? norm_parts_ : nullptr);
  Residual res;
  for (int l = 0; l < cfg_.layers; ++l) {
    attention_block(pass, res, l);
    if (cfg_.routes(l)) {
      moe_block(pass, res, l);
    } else {
      feed_forward_block(pass, res, l);
    }
  }
  if (logit_count == 0) return;
  project_normed(pass, res, weights_.final_norm, weights_.final_norm_scale, weights_.lm_head,
                 logits_, logit_first, logit_count, nullptr, false);
}

void Model::forward(const Step& step, bool decode_mode, int logit_first, int logit_count) {
  upload_meta(step, step.table_stride);
  step_max_kv_ = step.max_kv_len;
  run_layers((int)step.ids.size(), step.table_stride, decode_mode, logit_first, logit_count);
  logits_rows_ = logit_count;
}

}  // namespace hearth
