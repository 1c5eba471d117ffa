// Logits -> one token per row, on the device, with engine/sampling.py's filters in its order:
// the token mask (structured output: disallowed tokens -inf), repetition penalty (raw logits) -> temperature -> top-k -> top-p -> min-p, then a draw with the
// given uniform u: the first kept token (vocabulary order) where the kept mass reaches u * total.
// Greedy rows take the argmax, ties to the lowest id. One 1024-thread block per row. Each filter
// keeps the tokens at or above a probability threshold, found by bisection on the float's bits
// (non-negative floats order like their bit patterns), so no sort is needed. Ties at a top-p
// boundary are all kept (the reference keeps the earlier ids of a tie).
#include "../common.cuh"
#include "kernels.h"

namespace hearth {

constexpr int kSampleThreads = 1024;

__device__ double block_sum_d(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Number of p >= t (as a float: exact below 2^24) over the row.
__device__ float count_at_least(const float* p, int vocab, float t, float* scratch) {
  float c = 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += p[i] >= t ? 1.f : 0.f;
  return block_sum(c, scratch);
}

__device__ double mass_above(const float* p, int vocab, float t, double* scratch) {
  double s = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (p[i] > t) s += p[i];
  return block_sum_d(s, scratch);
}

__global__ void __launch_bounds__(kSampleThreads)
sample_kernel(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ params,
              const int32_t* __restrict__ history, float* __restrict__ work,
              int32_t* __restrict__ tokens) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  __shared__ double chunk_sum[kSampleThreads];
  __shared__ float best_v[kSampleThreads];
  __shared__ int best_i[kSampleThreads];
  const int row = blockIdx.x, tid = threadIdx.x;
  const SampleRow prm = params[row];
  const float* lg = logits + (size_t)row * vocab;
  float* x = work + (size_t)row * vocab;

  // Greedy without a penalty or a mask reads the logits where they are (the copy was half of its time).
  const uint32_t* mask =
      prm.mask_offset >= 0 ? reinterpret_cast<const uint32_t*>(history + prm.mask_offset) : nullptr;
  const bool in_place = prm.greedy && prm.penalty == 1.f && !mask;
  if (in_place) x = const_cast<float*>(lg);  // only read below
  else if (mask)
    for (int i = tid; i < vocab; i += blockDim.x)
      x[i] = (mask[i >> 5] >> (i & 31)) & 1u ? lg[i] : -INFINITY;
  else
    for (int i = tid; i < vocab; i += blockDim.x) x[i] = lg[i];
  __syncthreads();
  if (prm.penalty != 1.f) {
    for (int j = tid; j < prm.hist_count; j += blockDim.x) {
      const int id = history[prm.hist_offset + j];
      const float v = x[id];
      x[id] = v > 0.f ? v / prm.penalty : v * prm.penalty;
    }
  }
  __syncthreads();

  if (prm.greedy) {
    float bv = -INFINITY;
    int bi = vocab;
#pragma unroll 8
    for (int i = tid; i < vocab; i += blockDim.x) {
      const float v = x[i];
      if (v > bv || bi == vocab) { bv = v; bi = i; }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) {
        const float ov = best_v[tid + s];
        const int oi = best_i[tid + s];
        if (ov > best_v[tid] || (ov == best_v[tid] && oi < best_i[tid])) {
          best_v[tid] = ov;
          best_i[tid] = oi;
        }
      }
      __syncthreads();
    }
    if (tid == 0) tokens[row] = best_i[0] < vocab ? best_i[0] : 0;
    return;
  }

  // Unnormalized probabilities exp((x - max) / T): the most likely token gets exactly 1.
  float local_max = -INFINITY;
  for (int i = tid; i < vocab; i += blockDim.x) local_max = fmaxf(local_max, x[i]);
  const float mx = block_max(local_max, fscratch);
  const float inv_t = 1.f / prm.temperature;
  for (int i = tid; i < vocab; i += blockDim.x) x[i] = expf((x[i] - mx) * inv_t);
  __syncthreads();

  const int one_bits = __float_as_int(1.f);
  float threshold = 0.f;
  if (prm.top_k > 0 && prm.top_k < vocab) {  // the k-th largest value: largest t with count >= k
    int lo = 0, hi = one_bits;
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (count_at_least(x, vocab, __int_as_float(mid), fscratch) >= (float)prm.top_k) lo = mid;
      else hi = mid - 1;
    }
    threshold = __int_as_float(lo);
  }
  if (prm.top_p < 1.f) {  // smallest t whose mass strictly above stays under top_p of the survivors
    double kept = 0.0;
    for (int i = tid; i < vocab; i += blockDim.x)
      if (x[i] >= threshold) kept += x[i];
    const double limit = (double)prm.top_p * block_sum_d(kept, dscratch);
    int lo = __float_as_int(threshold), hi = one_bits;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (mass_above(x, vocab, __int_as_float(mid), dscratch) < limit) hi = mid;
      else lo = mid + 1;
    }
    threshold = fmaxf(threshold, __int_as_float(lo));
  }
  if (prm.min_p > 0.f) threshold = fmaxf(threshold, prm.min_p);  // min_p * max, and max == 1

  // Draw: per-thread contiguous chunks, their kept mass, then thread 0 walks to the target.
  const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int begin = tid * chunk, end = min(vocab, begin + chunk);
  double s = 0.0;
  for (int i = begin; i < end; ++i)
    if (x[i] >= threshold && x[i] > 0.f) s += x[i];
  chunk_sum[tid] = s;
  __syncthreads();
  if (tid == 0) {
    double total = 0.0;
    for (int t = 0; t < (int)blockDim.x; ++t) total += chunk_sum[t];
    const double target = prm.uniform * total;
    double cum = 0.0;
    int pick = -1, last_kept = -1;
    for (int t = 0; t < (int)blockDim.x && pick < 0; ++t) {
      if (chunk_sum[t] == 0.0) continue;
      if (cum + chunk_sum[t] < target) {
        cum += chunk_sum[t];
        const int e = min(vocab, (t + 1) * chunk);
        for (int i = e - 1; i >= t * chunk; --i)
          if (x[i] >= threshold && x[i] > 0.f) { last_kept = i; break; }
        continue;
      }
      const int e = min(vocab, (t + 1) * chunk);
      for (int i = t * chunk; i < e; ++i) {
        if (!(x[i] >= threshold && x[i] > 0.f)) continue;
        cum += x[i];
        last_kept = i;
        if (cum >= target) { pick = i; break; }
      }
    }
    tokens[row] = pick >= 0 ? pick : (last_kept >= 0 ? last_kept : 0);
  }
}

void launch_sample(const float* logits, int rows, int vocab, const SampleRow* params,
                   const int32_t* history, float* work, int32_t* tokens, cudaStream_t stream) {
  HEARTH_REQUIRE(rows >= 0 && vocab > 0, "sample: bad shape");
  if (rows == 0) return;
  sample_kernel<<<rows, kSampleThreads, 0, stream>>>(logits, vocab, params, history, work, tokens);
  HEARTH_CHECK_LAUNCH("sample_kernel");
}

}  // namespace hearth
