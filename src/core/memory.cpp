#include "kqlora/core/memory.hpp"

#include <Kokkos_Core.hpp>

#include <sys/resource.h>
#include <unistd.h>
#include <atomic>
#include <fstream>
#include <string>

namespace kqlora {

namespace {

std::atomic<int64_t> current{0}, peak{0};
bool installed = false;

void on_allocate(const Kokkos_Profiling_SpaceHandle, const char*, const void* const,
                 uint64_t size) {
  const int64_t now = current += static_cast<int64_t>(size);
  int64_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

void on_deallocate(const Kokkos_Profiling_SpaceHandle, const char*, const void* const,
                   uint64_t size) {
  current -= static_cast<int64_t>(size);
}

int64_t status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size())) * 1024;
  }
  return 0;
}

}  // namespace

void track_kokkos_allocations() {
  if (installed) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  installed = true;
}

int64_t tracked_peak_bytes() {
  return peak.load();
}

int64_t tracked_bytes() {
  return current.load();
}

void reset_tracked_peak() {
  peak = current.load();
}

int64_t rss_bytes() {
  return status_kb("VmRSS:");
}
int64_t peak_rss_bytes() {
  return status_kb("VmHWM:");
}

int64_t minor_page_faults() {
  struct rusage u {};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_minflt) : 0;
}

}  // namespace kqlora
