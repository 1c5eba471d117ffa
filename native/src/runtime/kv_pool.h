// The paged KV cache's bookkeeping: one pool of fixed-size blocks shared by every sequence of a
// model, a block table per sequence, blocks returned on release and truncate. Pure host code; the
// device memory itself belongs to the Model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace hearth {

class KvPool {
 public:
  KvPool(int block_count, int block_size, int max_sequence_blocks);

  int allocate_sequence();
  void release_sequence(int seq);
  int length(int seq) const;
  // Make room for `new_length` tokens (allocating blocks); throws CacheFull, changing nothing.
  void reserve(int seq, int new_length);
  // Set the length; frees the blocks past it.
  void set_length(int seq, int length);
  const std::vector<int32_t>& blocks(int seq) const;
  // The cache slot (block * block_size + offset) of position `pos` of `seq`.
  int32_t slot(int seq, int pos) const;

  int free_blocks() const { return (int)free_.size(); }
  int total_blocks() const { return block_count_; }
  int block_size() const { return block_size_; }
  int max_sequence_blocks() const { return max_sequence_blocks_; }
  size_t sequence_count() const { return seqs_.size(); }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  Sequence& get(int seq);
  const Sequence& get(int seq) const;

  int block_count_, block_size_, max_sequence_blocks_;
  int next_id_ = 1;
  std::vector<int32_t> free_;
  std::unordered_map<int, Sequence> seqs_;
};

}  // namespace hearth
