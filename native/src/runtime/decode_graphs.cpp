// Decode steps: one token per sequence, padded to the next captured bucket (1, 2, 4, ...,
// max_batch) and replayed as one CUDA graph; the graphs are captured at load, one per bucket,
// over padding rows that write and read only the dummy KV block.
#include <algorithm>
#include <set>

#include "model.h"

namespace hearth {

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

void Model::check_tokens(const std::vector<int32_t>& tokens) const {
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg_.vocab)
      throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary of " +
                              std::to_string(cfg_.vocab));
}

}  // namespace hearth
