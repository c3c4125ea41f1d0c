#include "kqlora/core/memory_budget.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kqlora/core/human_units.hpp"

namespace kqlora {

namespace {

// A limit file holding bytes ("max" or an absurd value: no limit), 0 when there is none.
int64_t limit_in(const std::string& path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  return *end == '\0' && v > 0 && v < (int64_t{1} << 60) ? v : 0;
}

int64_t mem_total() {
  std::ifstream f("/proc/meminfo");
  for (std::string key; f >> key;) {
    long long kib = 0;
    f >> kib;
    if (key == "MemTotal:") return kib * 1024;
    f.ignore(1 << 10, '\n');
  }
  return 0;
}

}  // namespace

MemoryBudget node_memory() {
  MemoryBudget b;
  if (const char* v = std::getenv("KQLORA_MEMORY_LIMIT")) {
    b.bytes = std::atoll(v);
    b.source = "KQLORA_MEMORY_LIMIT " + human_bytes(static_cast<double>(b.bytes));
    return b;
  }
  b.bytes = mem_total();
  b.source = "MemTotal " + human_bytes(static_cast<double>(b.bytes));
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const int64_t limit = limit_in(path);
    if (limit > 0 && (b.bytes == 0 || limit < b.bytes)) {
      b.bytes = limit;
      b.source = std::string("cgroup ") + path + " " + human_bytes(static_cast<double>(limit));
    }
  }
  return b;
}

}  // namespace kqlora
