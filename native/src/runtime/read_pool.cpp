#include "read_pool.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace hearth {

bool pread_full(int fd, char* dst, size_t bytes, int64_t offset) {
  while (bytes > 0) {
    const ssize_t n = pread(fd, dst, bytes, (off_t)offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) return false;  // end of file before the range ended
    dst += n;
    bytes -= (size_t)n;
    offset += n;
  }
  return true;
}

ReadPool::ReadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ReadPool::~ReadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ReadPool::run_pieces() {
  bool ok = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < pieces_) {
    const int i = next_++;
    const size_t begin = (size_t)i * piece_;
    const size_t n = std::min(piece_, bytes_ - begin);
    const int fd = fd_;
    const int64_t off = offset_ + (int64_t)begin;
    char* dst = dst_ + begin;
    lock.unlock();
    errno = 0;
    const bool piece_ok = pread_full(fd, dst, n, off);
    const int err = errno;
    lock.lock();
    if (!piece_ok && error_.empty())
      error_ = err ? std::strerror(err) : std::string("unexpected end of file");
    ok = ok && piece_ok;
    if (++finished_ == pieces_) done_.notify_all();
  }
  return ok;
}

void ReadPool::worker() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (generation_ != seen && next_ < pieces_); });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    run_pieces();
    lock.lock();
  }
}

void ReadPool::read(int fd, int64_t offset, char* dst, size_t bytes, const std::string& path) {
  if (bytes == 0) return;
  constexpr size_t kMinPiece = 1u << 20;  // below 1 MiB a piece is not worth a thread
  const size_t want = std::max<size_t>(1, std::min<size_t>((size_t)threads(), bytes / kMinPiece));
  if (want == 1) {
    errno = 0;
    if (!pread_full(fd, dst, bytes, offset))
      throw std::runtime_error("cannot read " + path + ": " +
                               (errno ? std::strerror(errno) : "unexpected end of file"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd_ = fd;
    offset_ = offset;
    dst_ = dst;
    bytes_ = bytes;
    piece_ = ((bytes + want - 1) / want + 4095) & ~(size_t)4095;  // page-aligned pieces
    pieces_ = (int)((bytes + piece_ - 1) / piece_);
    next_ = 0;
    finished_ = 0;
    error_.clear();
    ++generation_;
  }
  wake_.notify_all();
  run_pieces();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == pieces_; });
  if (!error_.empty()) throw std::runtime_error("cannot read " + path + ": " + error_);
}

}  // namespace hearth
