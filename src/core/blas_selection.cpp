#include "kqlora/core/blas_selection.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#ifdef __linux__
#include <sched.h>
#endif

namespace kqlora {

namespace {

// What kqlora did, for describe(); written once during start-up, before any thread exists.
std::string kernel_note = "kernel not examined";
std::string threads_note = "threads not examined";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

/// Width in bits of an OpenBLAS x86 core's sgemm FMA kernel: 512, 256, 0 for the older
/// (SSE, AVX without FMA, 128-bit FMA4) ones, -1 for names kqlora does not know.
int core_fma_width(const std::string& core) {
  const std::string c = lower(core);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return 512;
  for (const char* n : {"haswell", "zen"})
    if (c == n) return 256;
  for (const char* n :
       {"unknown",   "katmai",       "coppermine",  "northwood",  "prescott",    "banias",
        "atom",      "core2",        "penryn",      "dunnington", "nehalem",     "athlon",
        "opteron",   "opteron_sse3", "barcelona",   "nano",       "sandybridge", "bobcat",
        "bulldozer", "piledriver",   "steamroller", "excavator"})
    if (c == n) return 0;
  return -1;
}

template <class F>
F lookup(const char* symbol) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, symbol));
}

std::string openblas_core() {
  auto f = lookup<char* (*)()>("openblas_get_corename");
  const char* name = f ? f() : nullptr;
  return name ? name : "";
}

/// "OpenBLAS 0.3.21", "BLIS 0.9.0", ... and the file the sgemm symbol comes from.
std::string library() {
  std::string name = "unknown BLAS";
  if (auto f = lookup<char* (*)()>("openblas_get_config")) {
    std::istringstream words(f() ? f() : "");
    std::string a, b;
    words >> a >> b;
    name = a + " " + b;
  } else if (auto g = lookup<const char* (*)()>("bli_info_get_version_str")) {
    name = std::string("BLIS ") + (g() ? g() : "");
  } else if (lookup<void*>("mkl_get_version_string") || lookup<void*>("MKL_Get_Version_String")) {
    name = "Intel MKL";
  }
  Dl_info info{};
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  if (sgemm && dladdr(sgemm, &info) && info.dli_fname) {
    char* real = realpath(info.dli_fname, nullptr);
    name += std::string(" (") + (real ? real : info.dli_fname) + ")";
    std::free(real);
  }
  return name;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int cpus_allowed() {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace

std::string preferred_openblas_core(const CpuFeatures& cpu, const std::string& current) {
  const int want = cpu.fma_width(), have = core_fma_width(current);
  if (want == 0 || have < 0 || have >= want) return "";
  if (want == 512) return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  const bool amd = cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine";
  return amd ? "Zen" : "Haswell";
}

void select_blas_kernel(char** argv) {
  // After our own re-execution the marker holds "seen>asked": report it, never loop.
  const std::string marker = env("KQLORA_BLAS_REEXEC");
  const auto sep = marker.find('>');
  if (sep != std::string::npos && env("OPENBLAS_CORETYPE") == marker.substr(sep + 1)) {
    const std::string seen = marker.substr(0, sep), asked = marker.substr(sep + 1);
    kernel_note = "kernel set by kqlora (OPENBLAS_CORETYPE=" + asked + "; the BLAS had chosen " +
                  seen + ", narrower than this CPU's FMA)";
    if (lower(openblas_core()) != lower(asked))
      kernel_note += ", but the BLAS runs " + openblas_core() + " (this build lacks " + asked + ")";
    return;
  }
  if (env("KQLORA_BLAS_AUTOTUNE") == "0") {
    kernel_note = "kernel kept (KQLORA_BLAS_AUTOTUNE=0)";
    return;
  }
  if (env_set("OPENBLAS_CORETYPE")) {
    kernel_note = "kernel from the user's OPENBLAS_CORETYPE=" + env("OPENBLAS_CORETYPE");
    return;
  }
  const bool hooked = env_set("KQLORA_BLAS_TEST_CORENAME");
  const std::string seen = hooked ? env("KQLORA_BLAS_TEST_CORENAME") : openblas_core();
  if (seen.empty()) {
    kernel_note = "kernel not managed (not OpenBLAS)";
    return;
  }
  const std::string target = preferred_openblas_core(cpu_features(), seen);
  if (target.empty()) {
    const char* why = cpu_features().fma_width() == 0 ? "this CPU has no AVX2/FMA"
                      : core_fma_width(seen) < 0      ? "a core kqlora does not know"
                                                      : "as wide as this CPU's FMA";
    kernel_note = "kernel kept (" + seen + (hooked ? " from KQLORA_BLAS_TEST_CORENAME" : "") +
                  ": " + why + ")";
    return;
  }
#ifdef __linux__
  // Safe before MPI_Init: exec keeps the PID, the environment, the open descriptors (the
  // launcher's PMI/PMIx connection) and the CPU binding, so mpirun and srun see the
  // process they started; nothing of MPI or Kokkos exists yet to lose.
  setenv("OPENBLAS_CORETYPE", target.c_str(), 1);
  setenv("KQLORA_BLAS_REEXEC", (seen + ">" + target).c_str(), 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("KQLORA_BLAS_REEXEC");
  kernel_note = "kernel kept (" + seen + "): re-executing with OPENBLAS_CORETYPE=" + target +
                " failed: " + std::strerror(err);
#else
  kernel_note = "kernel kept (" + seen + "): set OPENBLAS_CORETYPE=" + target +
                " for this CPU's FMA width (kqlora re-executes itself on Linux only)";
#endif
}

void select_blas_threads(int ranks_on_node) {
  auto set = lookup<void (*)(int)>("openblas_set_num_threads");
  auto parallel = lookup<int (*)()>("openblas_get_parallel");
  if (!set) {
    threads_note = "threads not managed (not OpenBLAS)";
    return;
  }
  const bool openmp = parallel && parallel() == 2;
  for (const char* var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"}) {
    if (env_set(var)) {
      threads_note = std::string("threads from ") + var;
      return;
    }
  }
  if (openmp && env_set("OMP_NUM_THREADS")) {
    threads_note = "threads from OMP_NUM_THREADS (an OpenMP BLAS)";
    return;
  }
  const int online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  const int ranks = std::max(1, ranks_on_node);
  const int threads = std::max(1, std::min(cpus_allowed(), online / ranks));
  set(threads);
  threads_note = "threads set by kqlora (" + std::to_string(online) + " CPUs / " +
                 std::to_string(ranks) + " rank" + (ranks > 1 ? "s" : "") + " on this node)";
}

int blas_threads() {
  auto get = lookup<int (*)()>("openblas_get_num_threads");
  return get ? std::max(1, get()) : 1;
}

std::string describe_blas() {
  if (!dlsym(RTLD_DEFAULT, "sgemm_"))
    return "none linked (host products, if any, through Kokkos Kernels' own kernels)";
  std::ostringstream os;
  os << library();
  const std::string core = openblas_core();
  if (!core.empty()) os << ", kernel " << core;
  if (auto get = lookup<int (*)()>("openblas_get_num_threads")) {
    const int t = get();
    os << ", " << t << " thread" << (t == 1 ? "" : "s");
  }
  os << "; " << kernel_note << "; " << threads_note;
  return os.str();
}

}  // namespace kqlora
