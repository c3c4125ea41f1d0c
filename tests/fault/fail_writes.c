// A fault injector for tests, loaded with LD_PRELOAD: no privileges, no mount. Writes to
// files under $KQLORA_FAULT_DIR fail with $KQLORA_FAULT_WRITE_ERRNO (ENOSPC or EIO) once
// $KQLORA_FAULT_AFTER_BYTES bytes have been written there (a disk that fills up, a disk
// that fails); with $KQLORA_FAULT_OPEN_ERRNO (EROFS or EACCES), creating a file or a
// directory there fails at once (a read-only file system, a directory without permission,
// which root cannot otherwise be refused). With $KQLORA_FAULT_STOP_RANK, the process of
// that MPI rank (the launcher's OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK) stops itself
// (SIGSTOP: a hung rank) when it opens a file under $KQLORA_FAULT_DIR whose name ends with
// $KQLORA_FAULT_STOP_AT. Everything else passes through.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static atomic_llong written;

static int errno_named(const char* name) {
  if (!name || !*name) return 0;
  if (!strcmp(name, "ENOSPC")) return ENOSPC;
  if (!strcmp(name, "EIO")) return EIO;
  if (!strcmp(name, "EROFS")) return EROFS;
  if (!strcmp(name, "EACCES")) return EACCES;
  return 0;
}

static int under_dir(const char* path) {
  const char* dir = getenv("KQLORA_FAULT_DIR");
  if (!dir || !*dir || !path) return 0;
  return strncmp(path, dir, strlen(dir)) == 0;
}

static int fd_under_dir(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return under_dir(path);
}

// 0: let the write of `count` bytes through; else the errno it fails with.
static int write_fault(int fd, size_t count) {
  const int err = errno_named(getenv("KQLORA_FAULT_WRITE_ERRNO"));
  if (!err || !fd_under_dir(fd)) return 0;
  const char* after = getenv("KQLORA_FAULT_AFTER_BYTES");
  const long long limit = after ? atoll(after) : 0;
  if (atomic_fetch_add(&written, (long long)count) + (long long)count > limit) return err;
  return 0;
}

static int open_fault(const char* path, int flags) {
  const int err = errno_named(getenv("KQLORA_FAULT_OPEN_ERRNO"));
  return err && (flags & (O_WRONLY | O_RDWR | O_CREAT)) && under_dir(path) ? err : 0;
}

static const char* launcher_rank(void) {
  const char* names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    const char* v = getenv(names[i]);
    if (v && *v) return v;
  }
  return NULL;
}

static void maybe_stop(const char* path) {
  const char* rank = getenv("KQLORA_FAULT_STOP_RANK");
  const char* suffix = getenv("KQLORA_FAULT_STOP_AT");
  const char* mine = launcher_rank();
  if (!rank || !suffix || !*suffix || !mine || strcmp(rank, mine) || !under_dir(path)) return;
  const size_t n = strlen(path), k = strlen(suffix);
  if (n >= k && !strcmp(path + n - k, suffix)) raise(SIGSTOP);
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t write(int fd, const void* buf, size_t count) {
  const int err = write_fault(fd, count);
  if (err) return errno = err, -1;
  return NEXT(write)(fd, buf, count);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  const int err = write_fault(fd, count);
  if (err) return errno = err, -1;
  return NEXT(pwrite)(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  const int err = write_fault(fd, count);
  if (err) return errno = err, -1;
  return NEXT(pwrite64)(fd, buf, count, offset);
}

static size_t iov_bytes(const struct iovec* iov, int n) {
  size_t b = 0;
  for (int i = 0; i < n; ++i) b += iov[i].iov_len;
  return b;
}

ssize_t writev(int fd, const struct iovec* iov, int n) {
  const int err = write_fault(fd, iov_bytes(iov, n));
  if (err) return errno = err, -1;
  return NEXT(writev)(fd, iov, n);
}

ssize_t pwritev(int fd, const struct iovec* iov, int n, off_t offset) {
  const int err = write_fault(fd, iov_bytes(iov, n));
  if (err) return errno = err, -1;
  return NEXT(pwritev)(fd, iov, n, offset);
}

// open, open64 and openat: the mode argument is there only with O_CREAT.
#define OPEN_WRAPPER(name, params, args)                            \
  int name params {                                                 \
    va_list ap;                                                     \
    va_start(ap, flags);                                            \
    const mode_t mode = (flags & O_CREAT) ? va_arg(ap, mode_t) : 0; \
    va_end(ap);                                                     \
    maybe_stop(path);                                               \
    const int err = open_fault(path, flags);                        \
    if (err) return errno = err, -1;                                \
    return NEXT(name) args;                                         \
  }

OPEN_WRAPPER(open, (const char* path, int flags, ...), (path, flags, mode))
OPEN_WRAPPER(open64, (const char* path, int flags, ...), (path, flags, mode))
OPEN_WRAPPER(openat, (int dirfd, const char* path, int flags, ...), (dirfd, path, flags, mode))

int mkdir(const char* path, mode_t mode) {
  const int err = errno_named(getenv("KQLORA_FAULT_OPEN_ERRNO"));
  if (err && under_dir(path)) {
    struct stat st;
    if (stat(path, &st) == 0) return errno = EEXIST, -1;
    return errno = err, -1;
  }
  return NEXT(mkdir)(path, mode);
}
