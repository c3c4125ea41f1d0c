#pragma once
// The first touch of fresh memory, done ahead and at once: the kernel places every page
// of a range (MADV_POPULATE_WRITE, Linux 5.14+; elsewhere one write per page that keeps
// the contents). A page fault per 4 KiB page costs about 1 s per GB on the VMs we
// measure on (docs/BENCHMARKS.md); populating first lets a restart report its reading
// apart from its first touch, and costs no more than the faults it replaces.

#include <cstddef>

namespace kqlora {

/// Places the pages of [p, p + bytes) in memory, contents unchanged.
void populate_pages(void* p, size_t bytes);

}  // namespace kqlora
