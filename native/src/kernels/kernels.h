// Launchers of every kernel family, one .cu file each. Host code (the runtime, tests through the
// bindings) calls these; each checks its arguments, launches on `stream` and checks the launch.
// Layouts are row-major. bf16 = __nv_bfloat16; activations between ops are fp32 unless noted.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hearth {
using bf16 = __nv_bfloat16;
using f16 = __half;

// A projection's weight [n, k] as it lies on the GPU. Bf16: the checkpoint's values (the `exact`
// precision). Fp16: the values times a per-tensor power of two chosen at load so the largest lands
// in [2^14, 2^15) (the `fast` precision's operand); `scale` = 2^-e undoes it, exactly, after the
// product. NvFp4 (docs/NVFP4.md): `data` the e2m1 codes [n, k/2] (two per byte, the even input in
// the low nibble), `block_scales` one e4m3 per 16 inputs [n, k/16], `scale` the fp32 global scale:
// true weight = e2m1 * e4m3 * scale. e2m1 * e4m3 is exact in 16 bits; the global scale is applied in
// fp32 to finished sums (in 16 bits it would underflow).
enum class WeightFormat { Bf16, Fp16, NvFp4 };
struct WeightView {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::Bf16;
  float scale = 1.f;  // true weight = stored * scale
  const uint8_t* block_scales = nullptr;  // NvFp4 only
};

// A 16-bit activation operand of the fast precision: fp16 values [rows, k] = true values / scale /
// row_scale[r]. `scale` is static (a normalized row is bounded by sqrt(hidden) * max|norm weight|,
// known at load); `row_scale` (per row, powers of two, or nullptr) comes from a producer that
// scales each row by its own largest magnitude (SwiGLU), and stays in the product's output rows
// for the consumer to apply.
struct Fp16Operand {
  const f16* data = nullptr;
  float scale = 1.f;
  const float* row_scale = nullptr;
};

// embedding.cu: out[t, :] = float(table[ids[t], :]) * table.scale; with `sum_squares`, also each
// row's sum of squares at sum_squares[t] (the partials a GemvNorm reads, count 1).
void launch_embedding(const int32_t* ids, int tokens, const WeightView& table, int vocab, int hidden,
                      float* out, cudaStream_t stream, float* sum_squares = nullptr);

// rmsnorm.cu: residual += delta (when delta != nullptr; each delta row times delta_row_scale[r]
// when given: the output rows of a product over a row-scaled operand), then
// y = residual * rsqrt(mean(residual^2) + eps) * weight per row, written to `out` (fp32) or, with
// out16 instead, as the fast product's operand fp16(y / out16_scale).
void launch_rmsnorm_residual(float* residual, const float* delta, const bf16* weight, float* out,
                             int rows, int hidden, float eps, cudaStream_t stream,
                             const float* delta_row_scale = nullptr, f16* out16 = nullptr,
                             float out16_scale = 1.f);

// bias.cu: x[r, c] += bias[c] for x [rows, cols].
void launch_add_bias(float* x, const bf16* bias, int rows, int cols, cudaStream_t stream);

// qk_norm.cu: in place, per row and head: x[r, col0 + h*hd : +hd] RMS-normalized times weight[hd].
void launch_head_rmsnorm(float* x, int rows, int row_stride, int col0, int heads, int head_dim,
                         const bf16* weight, float eps, cudaStream_t stream);

// Where rotated queries, keys and values go (rope.cuh): q_out [tokens, heads * hd] fp32, the
// caches [slot, kv_heads, hd] bf16 at slots[t]; positions[t] and inv_freq [hd / 2] give the angles.
struct RopeTarget {
  const int32_t* positions;
  const int32_t* slots;
  const float* inv_freq;
  float* q_out;
  bf16* k_cache;
  bf16* v_cache;
  int heads, kv_heads, head_dim;
};

// Per-head RMSNorm weights (Qwen3's q_norm / k_norm, [hd] each) applied before the rotation;
// q null: none.
struct HeadNorm {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  float eps = 0.f;
};

// rope_kv.cu: rotary embedding (rotate-half convention) of q and k from the fused qkv rows
// [tokens, (H + 2*KV)*hd], each head first normalized where `norm` has weights, stored with v
// where `target` says.
void launch_rope_kv_write(const float* qkv, int tokens, const RopeTarget& target, cudaStream_t stream,
                          const HeadNorm& norm = {});

// Paged attention. q [rows, H*hd] fp32; caches [slot, KV, hd] bf16; block_tables [tables, max_blocks]
// (physical block ids); row_table[r] picks a row's table; kv_lens[r] keys visible to row r
// (causal: its position + 1). out [rows, H*hd] fp32.
struct PagedAttention {
  const float* q;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* block_tables;
  const int32_t* row_table;
  const int32_t* kv_lens;
  float* out;
  int rows, heads, kv_heads, head_dim, block_size, max_blocks;
  float scale;
};

// attention_decode.cu: one query per row, split along the keys in `split_len` pieces
// (partials: [rows, heads, max_splits] m and l, [rows, heads, max_splits, hd] acc), merged by the
// last piece's block in the same kernel. `counters`: rows * heads ints, zero before the first
// launch; each launch leaves them zero. split_len 0: each row picks its own from its kv_len
// (max(256, kv_len / max_splits rounded up to 32)); a given split_len times max_splits (<= 32)
// must cover every row. A block serves decode_attention_group(...) query heads sharing one KV head
// (1 for few rows x heads, for many the KV head's group or up to 4 heads of it: chosen from the shape);
// decode_attention_grid_splits: the blocks per (row, head group) of a launch (one wave of
// blocks_per_sm an SM). A warp stages its chunk's K / V rows in shared memory (cp.async); each
// block reads its metadata and prefetches its first piece of K / V into L2 before waiting for rope.
void launch_decode_attention(const PagedAttention& p, int split_len, int max_splits,
                             float* partial_ml, float* partial_acc, int* counters,
                             cudaStream_t stream);
int decode_attention_grid_splits(int rows, int blocks_x, int blocks_per_sm, int max_splits);
int decode_attention_group(int rows, int heads, int kv_heads, int head_dim);

// attention_prefill.cu: many queries (a prompt chunk) attending causally to the paged cache, on
// tensor cores for head sizes up to 128 (q and P as bf16 hi + lo for the exact precision, one bf16
// product each for fast), in fp32 per row (the scalar kernel) for 256. All rows of one call use row_table[0]'s table (a prompt chunk does).
// Key split for few query tiles over long history (flash-decoding style): with `work`, the
// tensor-core kernel splits the keys over prefill_key_splits(...) blocks per (head, query tile)
// and merges; partials need splits * rows * heads * (2 + hd) floats (part_rows >= splits * rows).
struct PrefillSplitWork {
  float* part_ml;   // [part_rows, heads, 2]
  float* part_acc;  // [part_rows, heads, hd]
  int part_rows;
  int max_kv_len;   // the largest kv_len of the call (host knows it for a prompt chunk)
};
int prefill_key_splits(int rows, int heads, int head_dim, int max_kv_len, int part_rows);
// split_products: q and P as bf16 hi + lo (exact); false: one bf16 product each (fast).
void launch_prefill_attention(const PagedAttention& p, cudaStream_t stream,
                              const PrefillSplitWork* work = nullptr, bool split_products = true);
// The fp32 scalar kernel alone, any head size (the kernel tests' second reference), and the
// tensor-core kernel with a forced key split (kernel tests).
void launch_prefill_attention_scalar(const PagedAttention& p, cudaStream_t stream);
void launch_prefill_attention_tc(const PagedAttention& p, cudaStream_t stream, int key_splits = 1,
                                 float* part_ml = nullptr, float* part_acc = nullptr,
                                 bool split_products = true);

// swiglu.cu: gate_up [rows, 2*inter] (gate first) -> y [rows, inter] = silu(gate) * up, written to
// `out` (fp32) or, with out16 instead, as the fast product's operand: each row scaled by the power
// of two that brings its largest |y| into [2^14, 2^15), fp16(y / row_scale[r]), row_scale[r] kept.
void launch_swiglu(const float* gate_up, float* out, int rows, int inter, cudaStream_t stream,
                   f16* out16 = nullptr, float* row_scale = nullptr);

// Activations stay fp32 between ops; products accumulate in fp32.
// gemv.cu: out [rows, n] fp32 = x [rows, k] fp32 @ w [n, k]^T (bf16, scaled fp16 or NVFP4 weights;
// k a multiple of 8, of 32 for NVFP4: gemv_k_supported), rows <= kGemvMaxRows.
// Optional fusions, so a decode layer needs no RMSNorm kernel:
//  - norm: x is the residual stream, normalized on the fly as rmsnorm.cu does, its rows' 1 / rms
//    taken from the sums of squares its producer left in `partials` [rows, count];
//  - residual: out is the residual stream and gets out += product; the launch leaves each row's
//    per-block sums of squares of the new values in `partials` [rows, gemv_blocks(rows, n, k)].
constexpr int kGemvMaxRows = 8;
struct GemvNorm {
  const bf16* weight;      // [k]
  const float* partials;   // [rows, count]
  int count;
  float eps;
};
struct GemvResidual {
  float* partials;         // [rows, gemv_blocks(rows, n, k)]
};
// The fast precision for NVFP4 weights (other formats ignore it; nullptr: the exact products): one
// fp16 product per weight, the activations divided by `scale` (a power of two bounding a normalized
// row, known at load; the norm's 1 / rms applied first), or per row by the power of two that brings
// its max |x| into [2^14, 2^15), from the producer's partials amax [rows, amax_count]. A SwiGLU
// product with amax_out leaves each row's per-block max |y| there ([rows, gemv_blocks(rows, 2 *
// inter, k)]) for the down product to take as its amax.
struct GemvFast {
  float scale = 1.f;
  const float* amax = nullptr;
  int amax_count = 0;
  float* amax_out = nullptr;
};
void launch_gemv(const float* x, const WeightView& w, float* out, int rows, int n, int k,
                 cudaStream_t stream, const GemvNorm* norm = nullptr,
                 const GemvResidual* residual = nullptr, const GemvFast* fast = nullptr);
// Blocks of one launch (the residual partials per row) and the k-split (1, 2, 4 or 8 warps per
// output row) for this shape and weight format.
int gemv_blocks(int rows, int n, int k, WeightFormat format = WeightFormat::Bf16);
int gemv_warps_per_row(int n, int k, WeightFormat format = WeightFormat::Bf16);
bool gemv_k_supported(int k, WeightFormat format);
int gemv_features_per_warp(int rows);  // output features per warp pass: 1 at one row, 4 at 2-8
// gemv.cu, SwiGLU epilogue: out [rows, inter] = silu(x @ gate^T) * (x @ up^T) for the fused
// w_gate_up [2 * inter, k] (gate rows first), each product summed exactly as launch_gemv would.
// `out` must not alias `x`. Only where gemv_swiglu_supported (block-aligned gate/up pairs).
bool gemv_swiglu_supported(int rows, int inter, int k, WeightFormat format = WeightFormat::Bf16);
// gemv.cu, rope epilogue: the fused qkv product [rows, (heads + 2 kv_heads) * hd] of the normalized
// residual (`norm` required) is not written; each block computes dim pairs (i, i + hd/2) of its
// heads and stores them as launch_rope_kv_write would (rope.cuh), each product summed exactly as
// launch_gemv would. Only where gemv_rope_supported (block-aligned pairs, <= 4 rows).
bool gemv_rope_supported(int rows, int n, int k, WeightFormat format = WeightFormat::Bf16);
void launch_gemv_rope(const float* x, const WeightView& w_qkv, int rows, int n, int k,
                      cudaStream_t stream, const GemvNorm& norm, const RopeTarget& rope,
                      const GemvFast* fast = nullptr);
void launch_gemv_swiglu(const float* x, const WeightView& w_gate_up, float* out, int rows,
                        int inter, int k, cudaStream_t stream, const GemvNorm* norm = nullptr,
                        const GemvFast* fast = nullptr);

// gemm.cu: the same product for many rows on tensor cores through cuBLASLt (loaded at first use),
// fp32 accumulation and output; where the library cannot be loaded, a tiled kernel.
//  - bf16 weights (exact): x fp32 split into two bf16 operands x = hi + lo (`split`: 2*rows*k bf16
//    of scratch), two products, so the activations keep ~16 bits of mantissa.
//  - fp16 weights (fast): one product of the fp16 operand, out = (x16 @ w16^T) * x.scale * w.scale
//    (row_scale, when the operand has one, stays in the output rows for the consumer).
// Both multiply by w.scale at the end (1 for checkpoint bf16; an NVFP4 weight's global scale once
// nvfp4.cu has expanded it into 16 bits: gemm_operand_for).
struct GemmWork {
  bf16* split = nullptr;  // [2 * rows, k] for the exact product
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
void launch_gemm_exact(const float* x, const WeightView& w, float* out, int rows, int n, int k,
                       const GemmWork& work, cudaStream_t stream);
void launch_gemm_fast(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                      const GemmWork& work, cudaStream_t stream);
bool cublaslt_available();      // tries to load libcublasLt once
const char* gemm_backend_name();

// gemm_nvfp4.cu: the fast product for 1..kGemmNvfp4MaxRows rows over an NVFP4 weight read in place
// (no expansion): out = (x16 @ w^T) * x.scale * w.scale, one fp16 product, fp32 sums (row_scale,
// when the operand has one, stays in the output rows as with launch_gemm_fast). k a multiple of 32.
// Narrow weights split k over a thread-block cluster (sm_90); no workspace.
constexpr int kGemmNvfp4MaxRows = 64;
void launch_gemm_nvfp4(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                       cudaStream_t stream);

// nvfp4.cu: an NVFP4 weight [n, k] expanded for the tensor-core product: out[i] = e2m1 * e4m3 as
// fp16 (to_fp16) or bf16, exact either way; the returned view carries the global scale (w.scale)
// for the product to apply in fp32. `out` holds n * k 16-bit values.
WeightView launch_nvfp4_expand(const WeightView& w, int n, int k, void* out, bool to_fp16,
                               cudaStream_t stream);

// moe.cu: the mixture-of-experts block (a layer's feed-forward when it routes; engine/moe.py).
// One layer's experts: gate_up [experts, 2 * inter, hidden] (expert e's gate rows, then its up
// rows) and down [experts, hidden, inter], both bf16 or both NVFP4 (codes and block scales as a
// projection's, experts stacked); an NVFP4 expert's global scale is gate_up_scales[e] /
// down_scales[e] (device arrays), else the view's scale. The shared expert is one expert of its own.
struct MoeExperts {
  WeightView gate_up, down;
  const float* gate_up_scales = nullptr;
  const float* down_scales = nullptr;
  int experts = 0, inter = 0, hidden = 0;
};
constexpr int kMoeTileRows = 64;      // sorted rows per grouped-GEMM tile
constexpr int kMoeGemvTileRows = 8;   // sorted rows per expert-GEMV tile (the mma's batch columns)
constexpr int kMoeTiledMaxRows = 64;  // tokens up to which NVFP4 experts take the tiled expert GEMV
bool moe_shape_supported(int hidden, int inter);  // multiples of 16
// logits [rows, n] fp32 = x [rows, k] @ w [n, k]^T (bf16 router rows; k a multiple of 8).
void launch_moe_router(const float* x, const bf16* w, float* logits, int rows, int n, int k,
                       cudaStream_t stream);
// Per row of logits [rows, stride]: softmax over the first `experts`, the top_k (<= 32) largest
// (ties: the lower expert), renormalised when asked: pair t * top_k + j gets its expert and weight.
void launch_moe_top_k(const float* logits, int rows, int stride, int experts, int top_k,
                      bool normalize, int32_t* pair_expert, float* pair_weight, cudaStream_t stream);
// Decode rows of the fused GEMV path (the residual stream holds the attention block's output and
// its per-block sums of squares): RMSNorm (xn = normalized rows, for the experts), router logits
// [rows, stride] and top-k pairs in one kernel; counters: `rows` ints, zero before the first launch
// (each launch leaves them zero).
struct MoeRoute {
  const float* resid;          // [rows, hidden]
  const float* norm_partials;  // [rows, norm_count]
  int norm_count;
  const bf16* norm_weight;     // [hidden]
  float eps;
  const bf16* router;          // [router_rows, hidden]: the experts' rows, then a shared-expert gate
  int router_rows, hidden, experts, top_k, normalize, stride;
  float* xn;
  float* logits;
  int32_t* pair_expert;
  float* pair_weight;
  int* counters;
};
void launch_moe_route(const MoeRoute& route, int rows, cudaStream_t stream);
// Few rows: the chosen experts' rows only, one block column per pair (NVFP4 experts on tensor
// cores, else one warp per output). gate_up: out = act [pairs, inter]
// = silu(x[p / top_k] . gate_e) * (x[p / top_k] . up_e); else out = y [pairs, hidden] = x[p] . down_e
// (x = act). pair_expert nullptr: expert 0 for every pair (the shared expert).
void launch_moe_expert_gemv(const float* x, const MoeExperts& ex, const int32_t* pair_expert,
                            int pairs, int top_k, bool gate_up, float* out, cudaStream_t stream);
// NVFP4 experts, sizes multiples of 32: the same GEMV over moe_sort's tiles of kMoeGemvTileRows
// pairs of one expert (each expert read once per tile), with the grouped GEMM's conventions:
// gate_up writes act by sorted position, down reads act by position and writes y by pair.
bool moe_tiled_gemv_supported(const MoeExperts& ex);
void launch_moe_expert_tiles(const float* x, const MoeExperts& ex, const int32_t* sorted, const int32_t* tiles,
                             int max_tiles, int top_k, bool gate_up, float* out, cudaStream_t stream);
// Many rows: the pairs sorted by expert (sorted[position] = pair) and cut into tiles of at most
// tile_rows (tiles[0] = count, then expert, first position, rows per tile), on the device;
// moe_max_tiles bounds the count (the grid of the kernels that read the tiles).
int moe_max_tiles(int pairs, int experts, int tile_rows);
void launch_moe_sort(const int32_t* pair_expert, int pairs, int experts, int tile_rows, int32_t* sorted,
                     int32_t* tiles, cudaStream_t stream);
// The grouped tensor-core GEMM over the sorted tiles (bf16 operands; split: the activation as bf16
// hi + lo, two products). gate_up: x the rows pairs were cut from (row sorted[pos] / top_k),
// out = act [pairs, inter] by sorted position; else x = act by sorted position and out = y
// [pairs, hidden] by pair.
void launch_moe_grouped(const float* x, const MoeExperts& ex, const int32_t* sorted,
                        const int32_t* tiles, int max_tiles, int top_k, bool gate_up, bool split,
                        float* out, cudaStream_t stream);
// The fast precision's grouped product over NVFP4 experts (moe_tiled_gemv_supported shapes), codes
// read in place, one fp16 product: the same conventions as launch_moe_grouped over moe_sort's tiles
// of tile_rows (kMoeTileRows, or kMoeGemvTileRows for 9-kMoeTiledMaxRows tokens), fp16 operands. gate_up: x16 = the normalized rows / x_scale [rows, hidden] -> act16 [pairs, inter] by
// sorted position, fp16(silu(g) * u) clamped to fp16's range; down: x16 = act16 (x_scale 1) -> y
// [pairs, hidden] by pair.
void launch_moe_grouped_nvfp4(const f16* x16, float x_scale, const MoeExperts& ex, const int32_t* sorted,
                              const int32_t* tiles, int max_tiles, int tile_rows, int top_k, bool gate_up,
                              f16* act16, float* y, cudaStream_t stream);
// resid[t] += sum_j pair_weight[t, j] * y[t * top_k + j] (+ sigmoid(shared_logit[t * stride]) *
// shared_y[t] where shared_y is given); with sum_squares, each new row's sums of squares in
// moe_combine_blocks(hidden) partials (what a GemvNorm reads).
int moe_combine_blocks(int hidden);
void launch_moe_combine(float* resid, const float* y, const float* pair_weight, int rows,
                        int top_k, int hidden, const float* shared_y, const float* shared_logit,
                        int logit_stride, float* sum_squares, cudaStream_t stream);

// convert.cu: hi = bf16(x), lo = bf16(x - hi) (the two operands of an fp32 activation).
void launch_split_bf16(const float* x, bf16* hi, bf16* lo, int64_t count, cudaStream_t stream);
// convert.cu: dst[i] = bf16(src[i]) from fp16 (src_dtype 1) or fp32 (src_dtype 2).
void launch_convert_to_bf16(const void* src, int src_dtype, bf16* dst, int64_t count,
                            cudaStream_t stream);
// convert.cu: dst[i] = fp16(src[i] / scale) (an fp32 activation as the fast product's operand).
void launch_convert_to_f16(const float* src, f16* dst, int64_t count, float scale,
                           cudaStream_t stream);
// convert.cu: *amax = max(*amax, max |x[i]|) over bf16 values (*amax zeroed by the caller).
void launch_amax_bf16(const bf16* x, int64_t count, float* amax, cudaStream_t stream);
// convert.cu, in place: the bf16 values at `data` become fp16(value / scale) (same 2 bytes each).
void launch_bf16_to_f16_inplace(void* data, int64_t count, float scale, cudaStream_t stream);

// The power of two s with amax / s in [2^14, 2^15): a scaled fp16 operand's scale (1 for 0).
float fp16_operand_scale(float amax);

// sampling.cu: one token per row of logits [rows, vocab] after a token mask (structured output),
// repetition penalty, temperature, top-k, top-p, min-p (engine/sampling.py's order and meaning),
// drawn with the given uniform.
struct SampleRow {
  float temperature, top_p, min_p, penalty;
  int top_k;
  int greedy;
  int hist_offset, hist_count;  // distinct token ids in `history` the penalty applies to
  // -1: no mask; else `history` holds ceil(vocab / 32) words from here, bit i % 32 of word i / 32
  // set where token i is allowed (the others become -inf before every filter).
  int mask_offset;
  double uniform;               // in [0, 1)
};
void launch_sample(const float* logits, int rows, int vocab, const SampleRow* params,
                   const int32_t* history, float* work, int32_t* tokens, cudaStream_t stream);

}  // namespace hearth
