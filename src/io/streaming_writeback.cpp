#include "kqlora/io/streaming_writeback.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kqlora/core/error.hpp"

namespace kqlora {

StreamingWriteback::StreamingWriteback(const std::string& path, int64_t window) : window_(window) {
#ifdef __linux__
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // (-1: nothing to do, see the header)
#else
  (void)path;
#endif
}

StreamingWriteback::~StreamingWriteback() {
  if (fd_ >= 0) ::close(fd_);
}

void StreamingWriteback::wrote(int64_t bytes) {
  if (fd_ < 0) return;
  pending_ += bytes;
  if (pending_ < window_) return;
  pending_ = 0;
#ifdef __linux__
  // Start writeback of every dirty page of the file (no wait), then drop the clean ones.
  int err = ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE) == 0 ? 0 : errno;
  if (err == 0) err = ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
  if (err == EINVAL || err == ESPIPE || err == ENOSYS || err == EOPNOTSUPP) {
    ::close(fd_);  // not supported for this file: stop trying
    fd_ = -1;
    return;
  }
  KQLORA_CHECK(err == 0, "writing back a checkpoint file: " << std::strerror(err));
#endif
}

}  // namespace kqlora
