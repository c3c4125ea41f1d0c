#include "kqlora/core/kernel_times.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kqlora {

namespace {

using Clock = std::chrono::steady_clock;

// The labels seen (a kernel's id is its index), and each running kernel's start.
struct Timing {
  std::mutex lock;
  std::map<std::string, uint64_t> ids;
  std::vector<std::string> labels;
  std::vector<double> seconds;
  std::vector<uint64_t> calls;
  std::map<uint64_t, Clock::time_point> started;  // (by a launch's own number)
  uint64_t next = 0;
  bool on = false;
};

Timing& timing() {
  static Timing t;
  return t;
}

void begun(const char* name, uint32_t, uint64_t* kid) {
  Timing& t = timing();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> g(t.lock);
  auto it = t.ids.find(name);
  if (it == t.ids.end()) {
    it = t.ids.emplace(name, t.labels.size()).first;
    t.labels.push_back(name);
    t.seconds.push_back(0);
    t.calls.push_back(0);
  }
  // (the launch's number carries its label's id in the low 32 bits)
  const uint64_t launch = (t.next++ << 32) | it->second;
  *kid = launch;
  t.started[launch] = now;
}

void ended(uint64_t kid) {
  const auto now = Clock::now();
  Timing& t = timing();
  std::lock_guard<std::mutex> g(t.lock);
  const auto it = t.started.find(kid);
  if (it == t.started.end()) return;
  const uint64_t id = kid & 0xffffffffu;
  t.seconds[id] += std::chrono::duration<double>(now - it->second).count();
  t.calls[id] += 1;
  t.started.erase(it);
}

}  // namespace

bool kernel_times_start() {
  const char* v = std::getenv("KQLORA_KERNEL_TIMES");
  // (a tool library's own callbacks left alone; kqlora's allocation tracking sets the
  // allocation callbacks only, which Kokkos 3.4 counts as "a library loaded")
  const bool tool = std::getenv("KOKKOS_TOOLS_LIBS") || std::getenv("KOKKOS_PROFILE_LIBRARY");
  if (!v || std::strcmp(v, "1") != 0 || tool) return false;
  namespace T = Kokkos::Tools::Experimental;
  T::set_begin_parallel_for_callback(&begun);
  T::set_begin_parallel_reduce_callback(&begun);
  T::set_begin_parallel_scan_callback(&begun);
  T::set_end_parallel_for_callback(&ended);
  T::set_end_parallel_reduce_callback(&ended);
  T::set_end_parallel_scan_callback(&ended);
  timing().on = true;
  return true;
}

void kernel_times_report(std::ostream& os, double total_seconds, int top) {
  Timing& t = timing();
  if (!t.on) return;
  std::lock_guard<std::mutex> g(t.lock);
  std::vector<size_t> order(t.labels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return t.seconds[a] > t.seconds[b]; });
  double kernels = 0, rest = 0;
  for (double s : t.seconds) kernels += s;
  const auto share = [&](double s) { return total_seconds > 0 ? 100.0 * s / total_seconds : 0.0; };
  os << "kernel times (KQLORA_KERNEL_TIMES=1; shares of " << std::fixed << std::setprecision(3)
     << total_seconds << " s):\n";
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    if (static_cast<int>(k) >= top) {
      rest += t.seconds[i];
      continue;
    }
    os << "  " << std::setw(6) << std::setprecision(2) << share(t.seconds[i]) << "%  "
       << std::setw(9) << std::setprecision(4) << t.seconds[i] << " s  " << std::setw(7)
       << t.calls[i] << " x  " << t.labels[i] << "\n";
  }
  if (rest > 0)
    os << "  " << std::setw(6) << std::setprecision(2) << share(rest) << "%  " << std::setw(9)
       << std::setprecision(4) << rest << " s  the other " << order.size() - top << " kernels\n";
  // (kernels launched at once from several host threads overlap: then the rest is not known)
  const double outside = std::max(0.0, total_seconds - kernels);
  os << "  " << std::setw(6) << std::setprecision(2) << share(outside) << "%  " << std::setw(9)
     << std::setprecision(4) << outside << " s  outside Kokkos kernels (vendor GEMMs, host code)"
     << (kernels > total_seconds ? " (kernels overlapped: their sum exceeds the loop)" : "")
     << "\n";
  os.unsetf(std::ios::fixed);
}

}  // namespace kqlora
