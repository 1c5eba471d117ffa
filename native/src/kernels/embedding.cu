// Embedding lookup: out[t, :] = float(table[ids[t], :]), the first residual stream of a forward pass.
// Ids are validated on the host; an id outside the table writes zeros rather than reading past it.
#include "../common.cuh"
#include "kernels.h"
#include "../launch.cuh"

namespace hearth {

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const bf16* __restrict__ table,
                                 int vocab, int hidden, float* __restrict__ out) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int id = ids[t];
  float* row_out = out + (size_t)t * hidden;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) row_out[i] = 0.f;
    return;
  }
  const bf16* row = table + (size_t)id * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) row_out[i] = __bfloat162float(row[i]);
}

void launch_embedding(const int32_t* ids, int tokens, const bf16* table, int vocab, int hidden,
                      float* out, cudaStream_t stream) {
  HEARTH_REQUIRE(tokens >= 0 && hidden > 0 && vocab > 0, "embedding: bad shape");
  if (tokens == 0) return;
  launch_pdl(embedding_kernel, tokens, 256, 0, stream, ids, table, vocab, hidden, out);
  HEARTH_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace hearth
