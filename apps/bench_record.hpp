#pragma once
// kqlora-bench's records and timing: a record is a name, a median time, the bytes it
// moves and the flops it does; times are medians of fenced repetitions.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "kqlora/core/kokkos_compat.hpp"

namespace kqlora::bench {

struct Record {
  std::string name;
  double median_s = 0;
  double bytes = 0;
  double flops = 0;
  double elements = 0;
  double ratio_to_dense = 0;  ///< QLoRA records: the median of the per-pair time ratios
  /// Llama step records: what one step (one more call, after the timing) launches; -1: not
  /// counted (not in the JSON). Vendor GEMM calls (core/gemm_calls.hpp), and through Kokkos
  /// Tools callbacks set in-process: kernels (parallel_for, _reduce, _scan), deep copies
  /// and fences (fences: Kokkos >= 3.6, whose fences call the tools; 3.4's do not).
  double gemm_calls = -1, kernel_launches = -1, deep_copies = -1, fences = -1;
};

/// True when `filter` (comma-separated texts; empty: all) names the record: one of its
/// texts is part of `name`.
inline bool wanted(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t a = 0;
  while (a <= filter.size()) {
    const size_t b = std::min(filter.find(',', a), filter.size());
    const std::string part = filter.substr(a, b - a);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    a = b + 1;
  }
  return false;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// Seconds of one call, fenced.
template <class F>
double seconds(F&& f) {
  const auto a = std::chrono::steady_clock::now();
  f();
  fence(Kokkos::DefaultExecutionSpace(), "kqlora::bench::timed");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

/// The median of `repeats` calls after one warm-up (page faults, caches, lazy set-up).
template <class F>
double median_seconds(int repeats, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(seconds(f));
  return median(t);
}

}  // namespace kqlora::bench
