#include "kqlora/core/populate_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // (Linux 5.14; older headers lack the name)
#endif

namespace kqlora {

void populate_pages(void* p, size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = a / page * page;
  const uintptr_t hi = (a + bytes + page - 1) / page * page;
  // The range rounded out to whole pages: the bytes outside [p, p + bytes) keep their
  // values either way.
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0) return;
  // Older kernels (EINVAL), or memory madvise refuses: one write per page.
  volatile char* c = static_cast<volatile char*>(p);
  for (uintptr_t off = 0; off < bytes; off += page) c[off] = c[off];
  c[bytes - 1] = c[bytes - 1];
}

}  // namespace kqlora
