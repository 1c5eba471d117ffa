// Block bookkeeping of the paged KV cache.
#include "kv_pool.h"

#include <stdexcept>
#include <string>

#include "../cuda_check.h"

namespace hearth {

KvPool::KvPool(int block_count, int block_size, int max_sequence_blocks)
    : block_count_(block_count), block_size_(block_size), max_sequence_blocks_(max_sequence_blocks) {
  HEARTH_REQUIRE(block_count > 0 && block_size > 0 && max_sequence_blocks > 0,
                 "KV pool: block counts and size must be positive");
  free_.reserve(block_count);
  for (int b = block_count - 1; b >= 0; --b) free_.push_back(b);  // hand out low ids first
}

KvPool::Sequence& KvPool::get(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::out_of_range("unknown sequence " + std::to_string(seq));
  return it->second;
}

const KvPool::Sequence& KvPool::get(int seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::out_of_range("unknown sequence " + std::to_string(seq));
  return it->second;
}

int KvPool::allocate_sequence() {
  const int id = next_id_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

void KvPool::release_sequence(int seq) {
  set_length(seq, 0);
  seqs_.erase(seq);
}

int KvPool::length(int seq) const { return get(seq).length; }

void KvPool::reserve(int seq, int new_length) {
  Sequence& s = get(seq);
  const int need = (new_length + block_size_ - 1) / block_size_;
  if (need > max_sequence_blocks_)
    throw CacheFull("context overflow: " + std::to_string(new_length) + " tokens exceed the " +
                    std::to_string(max_sequence_blocks_ * block_size_) + "-token context");
  const int more = need - (int)s.blocks.size();
  if (more <= 0) return;
  if (more > (int)free_.size())
    throw CacheFull("KV cache is full: " + std::to_string(more) + " more blocks needed, " +
                    std::to_string(free_.size()) + " free");
  for (int i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
}

void KvPool::set_length(int seq, int length) {
  Sequence& s = get(seq);
  HEARTH_REQUIRE(length >= 0, "sequence length must be >= 0");
  const int keep = (length + block_size_ - 1) / block_size_;
  while ((int)s.blocks.size() > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  HEARTH_REQUIRE(length <= (int)s.blocks.size() * block_size_, "sequence length past its blocks");
  s.length = length;
}

const std::vector<int32_t>& KvPool::blocks(int seq) const { return get(seq).blocks; }

int32_t KvPool::slot(int seq, int pos) const {
  const Sequence& s = get(seq);
  return s.blocks[pos / block_size_] * block_size_ + pos % block_size_;
}

}  // namespace hearth
