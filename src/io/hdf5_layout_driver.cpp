#include "kqlora/io/hdf5_layout_driver.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

#include "kqlora/io/hdf5_file.hpp"

namespace kqlora::h5 {

namespace {

struct LayoutFile {
  H5FD_t pub;  // first: HDF5 sees a LayoutFile as its H5FD_t
  int fd = -1;
  haddr_t eoa = 0;      // end of the address space HDF5 has allocated
  haddr_t eof = 0;      // end of the file on disk (holes included)
  haddr_t written = 0;  // end of the bytes written so far
  dev_t device = 0;
  ino_t inode = 0;
};

LayoutFile* as_file(H5FD_t* f) {
  return reinterpret_cast<LayoutFile*>(f);
}
const LayoutFile* as_file(const H5FD_t* f) {
  return reinterpret_cast<const LayoutFile*>(f);
}

H5FD_t* layout_open(const char* name, unsigned flags, hid_t, haddr_t maxaddr) {
  if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF) return nullptr;
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  const int fd = ::open(name, o, 0666);
  if (fd < 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  auto* f = new (std::nothrow) LayoutFile();
  if (!f) {
    ::close(fd);
    return nullptr;
  }
  f->fd = fd;
  f->eof = f->written = static_cast<haddr_t>(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  return &f->pub;
}

herr_t layout_close(H5FD_t* file) {
  LayoutFile* f = as_file(file);
  const int rc = ::close(f->fd);
  delete f;
  return rc == 0 ? 0 : -1;
}

int layout_cmp(const H5FD_t* a, const H5FD_t* b) {
  const LayoutFile *x = as_file(a), *y = as_file(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t layout_query(const H5FD_t*, unsigned long* flags) {
  // As sec2: metadata and small raw data aggregated, metadata accumulated.
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t layout_get_eoa(const H5FD_t* file, H5FD_mem_t) {
  return as_file(file)->eoa;
}

herr_t layout_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  as_file(file)->eoa = addr;
  return 0;
}

haddr_t layout_get_eof(const H5FD_t* file, H5FD_mem_t) {
  return as_file(file)->eof;
}

herr_t layout_get_handle(H5FD_t* file, hid_t, void** handle) {
  if (!handle) return -1;
  *handle = &as_file(file)->fd;
  return 0;
}

herr_t layout_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  LayoutFile* f = as_file(file);
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) {  // past the end of the file: zeros, as sec2
      std::memset(p, 0, size);
      break;
    }
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  return 0;
}

bool all_zero(const char* p, size_t size) {
  // Word by word: the fillers are megabytes.
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0) return false;
  }
  for (; i < size; ++i)
    if (p[i] != 0) return false;
  return true;
}

herr_t layout_write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  LayoutFile* f = as_file(file);
  if (addr + size > f->eoa) return -1;  // HDF5 writes only what it allocated
  const auto* p = static_cast<const char*>(buf);
  if (addr >= f->written && all_zero(p, size)) {
    // Zeros where nothing was written: a hole reads the same. (The file is extended to
    // cover it when it closes.)
    f->eof = std::max(f->eof, static_cast<haddr_t>(addr + size));
    return 0;
  }
  const haddr_t end = addr + size;
  while (size > 0) {
    const ssize_t n = ::pwrite(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  f->written = std::max(f->written, end);
  f->eof = std::max(f->eof, end);
  return 0;
}

herr_t layout_truncate(H5FD_t* file, hid_t, hbool_t) {
  LayoutFile* f = as_file(file);
  // The file ends at the end of the address space, holes included (as sec2 does it).
  struct stat st;
  if (::fstat(f->fd, &st) != 0) return -1;
  if (static_cast<haddr_t>(st.st_size) != f->eoa &&
      ::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0)
    return -1;
  f->eof = f->eoa;
  f->written = std::min(f->written, f->eoa);
  return 0;
}

H5FD_class_t make_class() {
  H5FD_class_t c;
  std::memset(&c, 0, sizeof(c));
  c.name = "kqlora-layout";
  c.maxaddr = (static_cast<haddr_t>(1) << (8 * sizeof(off_t) - 1)) - 1;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = layout_open;
  c.close = layout_close;
  c.cmp = layout_cmp;
  c.query = layout_query;
  c.get_eoa = layout_get_eoa;
  c.set_eoa = layout_set_eoa;
  c.get_eof = layout_get_eof;
  c.get_handle = layout_get_handle;
  c.read = layout_read;
  c.write = layout_write;
  c.truncate = layout_truncate;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::copy(map, map + H5FD_MEM_NTYPES, c.fl_map);
  return c;
}

}  // namespace

hid_t layout_fapl() {
  static const H5FD_class_t cls = make_class();
  static const hid_t driver = KQLORA_H5(H5FDregister(&cls));
  const hid_t fapl = KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS));
  KQLORA_H5(H5Pset_driver(fapl, driver, nullptr));
  set_checksummed_format(fapl);
  return fapl;
}

}  // namespace kqlora::h5
