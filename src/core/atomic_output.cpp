#include "kqlora/core/atomic_output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/fs.h>  // RENAME_EXCHANGE
#endif
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace fs = std::filesystem;

namespace {

std::atomic<int> serial{0};

/// `.<name>.tmp-<pid>-<n>` beside `path`.
std::string temp_beside(const std::string& path) {
  fs::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  return (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                             "-" + std::to_string(serial++)))
      .string();
}

/// fsync of a file or directory (a rename is durable once its directory is).
void sync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  KQLORA_CHECK(rc == 0 || err == EINVAL, p << ": fsync failed: " << std::strerror(err));
}

std::string folder_of(const std::string& path) {
  const fs::path p = fs::absolute(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace

FileOutput::FileOutput(std::string path) : path_(std::move(path)), temp_(temp_beside(path_)) {
  const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  const int err = errno;
  // (No folder to write in is the user's path; anything else, a failure to write.)
  KQLORA_INPUT_CHECK(fd >= 0 || (err != ENOENT && err != ENOTDIR),
                     path_ << ": cannot create a file there: " << std::strerror(err));
  KQLORA_CHECK(fd >= 0,
               path_ << ": cannot create the temporary " << temp_ << ": " << std::strerror(err));
  ::close(fd);
}

FileOutput::~FileOutput() {
  if (!done_) std::remove(temp_.c_str());
}

void FileOutput::commit() {
  sync_path(temp_, false);
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    KQLORA_CHECK(false, path_ << ": renaming " << temp_ << " failed: " << std::strerror(err));
  }
  done_ = true;
  sync_path(folder_of(path_), true);
}

void DirectoryOutput::check(const std::string& option, const std::string& path,
                            const std::function<bool(const std::string&)>& own) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  KQLORA_INPUT_CHECK(S_ISDIR(st.st_mode),
                     option << " " << path << " exists and is not a directory");
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    KQLORA_INPUT_CHECK(!e.is_directory() && own(name),
                       option << " " << path << " holds '" << name
                              << "', which this export does not write: it is not an earlier "
                                 "output of the same kind (choose a new or empty directory)");
  }
}

DirectoryOutput::DirectoryOutput(const std::string& option, std::string path,
                                 const std::function<bool(const std::string&)>& own)
    : path_(std::move(path)) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  check(option, path_, own);
  temp_ = temp_beside(path_);
  const int rc = ::mkdir(temp_.c_str(), 0755);
  const int err = errno;
  // (No folder to write in is the user's path; anything else, a failure to write.)
  KQLORA_INPUT_CHECK(
      rc == 0 || (err != ENOENT && err != ENOTDIR),
      option << " " << path_ << ": cannot create a directory there: " << std::strerror(err));
  KQLORA_CHECK(rc == 0,
               path_ << ": cannot create the temporary " << temp_ << ": " << std::strerror(err));
}

DirectoryOutput::~DirectoryOutput() {
  if (done_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

void DirectoryOutput::commit() {
  for (const auto& e : fs::directory_iterator(temp_)) sync_path(e.path().string(), false);
  sync_path(temp_, true);
  struct stat st {};
  if (::lstat(path_.c_str(), &st) != 0) {
    KQLORA_CHECK(std::rename(temp_.c_str(), path_.c_str()) == 0,
                 path_ << ": renaming " << temp_ << " failed: " << std::strerror(errno));
  } else {
    // Exchanged in one step where the kernel and file system can (Linux's renameat2);
    // elsewhere the previous output goes aside first, so one of the two is always whole.
    long rc = -1;
#ifdef RENAME_EXCHANGE
    rc =
        ::syscall(SYS_renameat2, AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE);
#endif
    if (rc != 0) {
      const std::string aside = temp_beside(path_);
      KQLORA_CHECK(std::rename(path_.c_str(), aside.c_str()) == 0,
                   path_ << ": moving the previous output aside failed: " << std::strerror(errno));
      KQLORA_CHECK(std::rename(temp_.c_str(), path_.c_str()) == 0,
                   path_ << ": renaming " << temp_ << " failed (the previous output is " << aside
                         << "): " << std::strerror(errno));
      temp_ = aside;
    }
    std::error_code ec;
    fs::remove_all(temp_, ec);  // (now the previous output)
  }
  done_ = true;
  sync_path(folder_of(path_), true);
}

}  // namespace kqlora
