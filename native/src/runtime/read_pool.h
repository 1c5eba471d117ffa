// Parallel file reads for weight loading: a fixed set of threads, each pread()ing its piece of
// one range into (pinned) memory; the calling thread takes pieces too and returns when the range
// has landed. pread from the page cache into already-pinned pages avoids the page faults of a
// memcpy out of a fresh mmap, and several threads keep several copies in flight.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hearth {

class ReadPool {
 public:
  explicit ReadPool(int threads);  // threads >= 1, the caller included
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;
  // Reads bytes [offset, offset + bytes) of fd into dst; throws std::runtime_error on a failed or
  // short read (path names the file in the message).
  void read(int fd, int64_t offset, char* dst, size_t bytes, const std::string& path);
  int threads() const { return (int)workers_.size() + 1; }

 private:
  void worker();
  bool run_pieces();  // takes pieces of the current job until none are left; false on error
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  // the current job
  int fd_ = -1;
  int64_t offset_ = 0;
  char* dst_ = nullptr;
  size_t bytes_ = 0, piece_ = 0;
  int pieces_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::string error_;
};

// pread until `bytes` have been read; false on an error or end of file.
bool pread_full(int fd, char* dst, size_t bytes, int64_t offset);

}  // namespace hearth
