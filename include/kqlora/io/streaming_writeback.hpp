#pragma once
// Keeps the page cache a large file write goes through small: every `window` bytes written
// (through any descriptor of the file), starts the kernel's writeback of the file's dirty
// pages and drops the pages already written back. Writes then reuse the same few pages
// instead of touching fresh memory for every byte of a checkpoint (on VMs that return
// freed memory to the host, each fresh page costs a host page fault), the disk works while
// the ranks copy, and a checkpoint does not evict the rest of the page cache. Advisory:
// off Linux, or on a file system without these calls, it does nothing (durability comes
// from the fsync that follows); an I/O error it sees is thrown.

#include <cstdint>
#include <string>

namespace kqlora {

class StreamingWriteback {
 public:
  explicit StreamingWriteback(const std::string& path, int64_t window = int64_t(64) << 20);
  ~StreamingWriteback();
  StreamingWriteback(const StreamingWriteback&) = delete;
  StreamingWriteback& operator=(const StreamingWriteback&) = delete;

  /// `bytes` more written to the file by this process.
  void wrote(int64_t bytes);

 private:
  int fd_ = -1;
  int64_t window_, pending_ = 0;
};

}  // namespace kqlora
