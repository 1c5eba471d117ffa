// Embedding lookup: out[t, :] = float(table[ids[t], :]) * scale, the first residual stream of a
// forward pass. The table is bf16 or scaled fp16 (it is the lm_head too where embeddings are tied).
// Ids are validated on the host; an id outside the table writes zeros rather than reading past it.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }

template <typename W>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const W* __restrict__ table,
                                 float scale, int vocab, int hidden, float* __restrict__ out,
                                 float* __restrict__ sum_squares) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int id = ids[t];
  float* row_out = out + (size_t)t * hidden;
  const bool valid = id >= 0 && id < vocab;
  const W* row = table + (size_t)(valid ? id : 0) * hidden;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = valid ? to_f32(row[i]) * scale : 0.f;
    row_out[i] = v;
    sq += v * v;
  }
  if (sum_squares) {  // uniform across the block: every thread reaches block_sum
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) sum_squares[t] = sq;
  }
}

void launch_embedding(const int32_t* ids, int tokens, const WeightView& table, int vocab, int hidden,
                      float* out, cudaStream_t stream, float* sum_squares) {
  HEARTH_REQUIRE(tokens >= 0 && hidden > 0 && vocab > 0 && table.data, "embedding: bad shape");
  if (tokens == 0) return;
  if (table.format == WeightFormat::Fp16)
    launch_pdl(embedding_kernel<f16>, tokens, 256, 0, stream, ids, static_cast<const f16*>(table.data),
               table.scale, vocab, hidden, out, sum_squares);
  else
    launch_pdl(embedding_kernel<bf16>, tokens, 256, 0, stream, ids,
               static_cast<const bf16*>(table.data), table.scale, vocab, hidden, out, sum_squares);
  HEARTH_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace hearth
