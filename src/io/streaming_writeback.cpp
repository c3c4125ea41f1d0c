#include "kqlora/io/streaming_writeback.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace kqlora {

StreamingWriteback::StreamingWriteback(const std::string& path, int64_t window) : window_(window) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // (-1: nothing to do, see the header)
}

StreamingWriteback::~StreamingWriteback() {
  if (fd_ >= 0) ::close(fd_);
}

void StreamingWriteback::wrote(int64_t bytes) {
  if (fd_ < 0) return;
  pending_ += bytes;
  if (pending_ < window_) return;
  pending_ = 0;
  bool ok = true;
#ifdef __linux__
  // Start writeback of every dirty page of the file (no wait), then drop the clean ones.
  ok = ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE) == 0;
#endif
  ok = ok && ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED) == 0;
  if (!ok) {  // not supported here: stop trying
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace kqlora
