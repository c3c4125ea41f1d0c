// A Kokkos Tools library that counts what a run launches: kernels (parallel_for, _reduce,
// _scan), deep copies and fences, with the most frequent kernel names, over a whole
// kqlora-train run (run it for 2 and 4 steps: the difference is the launches of 2 steps).
// The GPU check counts one bench step in-process instead (kqlora-bench's llama records:
// gemm_calls, kernel_launches, deep_copies, fences; docs/BLAS.md).
//
//   g++ -O2 -shared -fPIC tools/kokkos_kernel_count.cpp -o kernel_count.so
//   KOKKOS_TOOLS_LIBS=$PWD/kernel_count.so KQLORA_KERNEL_COUNT_FILE=counts.txt kqlora-train ...
//
// (KOKKOS_PROFILE_LIBRARY for Kokkos 3.x.) Writes "kernels N", "deep_copies N",
// "fences N", then "kernel COUNT NAME" and "fence COUNT NAME" lines (the 20 most frequent
// of each) at Kokkos::finalize.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace {

using Names = std::map<std::string, uint64_t>;
uint64_t kernels = 0, deep_copies = 0, fences = 0;
Names* kernel_names = nullptr;  // (never freed: the tool lives as long as the process)
Names* fence_names = nullptr;

void count(Names*& names, const char* name) {
  if (!names) names = new Names;
  ++(*names)[name ? name : "(unnamed)"];
}

void kernel(const char* name) {
  ++kernels;
  count(kernel_names, name);
}

void top(FILE* f, const char* what, const Names* names) {
  if (!names) return;
  std::vector<std::pair<uint64_t, std::string>> v;
  for (const auto& [n, c] : *names) v.push_back({c, n});
  std::sort(v.rbegin(), v.rend());
  for (size_t i = 0; i < v.size() && i < 20; ++i)
    std::fprintf(f, "%s %llu %s\n", what, static_cast<unsigned long long>(v[i].first),
                 v[i].second.c_str());
}

}  // namespace

struct SpaceHandle {
  char name[64];
};

// Kokkos Tools' settings (Kokkos >= 3.6 asks for them): without this answer Kokkos fences
// around every kernel for the tool, and those fences would be counted as the program's.
struct Kokkos_Tools_ToolSettings {
  bool requires_global_fencing;
  bool padding[255];
};

extern "C" {

void kokkosp_init_library(int, uint64_t, uint32_t, void*) {}

void kokkosp_request_tool_settings(uint32_t, Kokkos_Tools_ToolSettings* settings) {
  settings->requires_global_fencing = false;
}

void kokkosp_finalize_library() {
  const char* path = std::getenv("KQLORA_KERNEL_COUNT_FILE");
  FILE* f = path ? std::fopen(path, "w") : stderr;
  if (!f) f = stderr;
  std::fprintf(
      f, "kernels %llu\ndeep_copies %llu\nfences %llu\n", static_cast<unsigned long long>(kernels),
      static_cast<unsigned long long>(deep_copies), static_cast<unsigned long long>(fences));
  top(f, "kernel", kernel_names);
  top(f, "fence", fence_names);
  if (f != stderr) std::fclose(f);
}

void kokkosp_begin_parallel_for(const char* name, uint32_t, uint64_t* id) {
  kernel(name);
  *id = 0;
}
void kokkosp_end_parallel_for(uint64_t) {}
void kokkosp_begin_parallel_reduce(const char* name, uint32_t, uint64_t* id) {
  kernel(name);
  *id = 0;
}
void kokkosp_end_parallel_reduce(uint64_t) {}
void kokkosp_begin_parallel_scan(const char* name, uint32_t, uint64_t* id) {
  kernel(name);
  *id = 0;
}
void kokkosp_end_parallel_scan(uint64_t) {}
void kokkosp_begin_deep_copy(SpaceHandle, const char*, const void*, SpaceHandle, const char*,
                             const void*, uint64_t) {
  ++deep_copies;
}
void kokkosp_end_deep_copy() {}
void kokkosp_begin_fence(const char* name, uint32_t, uint64_t* id) {
  ++fences;
  count(fence_names, name);
  *id = 0;
}
void kokkosp_end_fence(uint64_t) {}

}  // extern "C"
