// The BLAS kernel and thread selection (docs/BLAS.md): the decision on recorded CPUs and
// core names, CPUID against the compiler's own detection, and the whole mechanism end to
// end through the apps (the re-execution, with and without mpiexec).

#include <gtest/gtest.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>

#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/cpu_features.hpp"

namespace {

using kqlora::CpuFeatures;
using kqlora::preferred_openblas_core;

CpuFeatures cpu(const char* vendor, int family, int model, int width, bool bf16 = false) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = family;
  f.model = model;
  f.avx2 = f.fma = width >= 256;
  f.avx512 = width >= 512;
  f.avx512_bf16 = bf16;
  return f;
}

TEST(BlasSelection, RecordedCpusAndCores) {
  // Intel Xeon family 6 model 207 (AVX-512 with BF16) under Debian 12's OpenBLAS 0.3.21.
  const auto emerald = cpu("GenuineIntel", 6, 207, 512, true);
  EXPECT_EQ(preferred_openblas_core(emerald, "Prescott"), "Cooperlake");
  EXPECT_EQ(preferred_openblas_core(emerald, "Haswell"), "Cooperlake");
  EXPECT_EQ(preferred_openblas_core(emerald, "Cooperlake"), "");
  EXPECT_EQ(preferred_openblas_core(emerald, "SapphireRapids"), "");
  // Skylake-SP (AVX-512, no BF16): an OpenBLAS that knows it picks SkylakeX.
  const auto skx = cpu("GenuineIntel", 6, 85, 512);
  EXPECT_EQ(preferred_openblas_core(skx, "Prescott"), "SkylakeX");
  EXPECT_EQ(preferred_openblas_core(skx, "SkylakeX"), "");
  EXPECT_EQ(preferred_openblas_core(skx, "SKYLAKEX"), "");  // names compare case-blind
  // AMD EPYC Zen 4 (family 25 model 17, AVX-512 with BF16): 0.3.21 says Zen (AVX2).
  const auto zen4 = cpu("AuthenticAMD", 25, 17, 512, true);
  EXPECT_EQ(preferred_openblas_core(zen4, "Zen"), "Cooperlake");
  // AMD EPYC Zen 3 (family 25 model 1, AVX2+FMA): Zen is its best kernel.
  const auto zen3 = cpu("AuthenticAMD", 25, 1, 256);
  EXPECT_EQ(preferred_openblas_core(zen3, "Zen"), "");
  EXPECT_EQ(preferred_openblas_core(zen3, "Haswell"), "");
  EXPECT_EQ(preferred_openblas_core(zen3, "Prescott"), "Zen");
  EXPECT_EQ(preferred_openblas_core(cpu("HygonGenuine", 24, 0, 256), "Barcelona"), "Zen");
  // Intel Haswell (AVX2+FMA).
  const auto hsw = cpu("GenuineIntel", 6, 63, 256);
  EXPECT_EQ(preferred_openblas_core(hsw, "Prescott"), "Haswell");
  EXPECT_EQ(preferred_openblas_core(hsw, "Sandybridge"), "Haswell");
  EXPECT_EQ(preferred_openblas_core(hsw, "Nehalem"), "Haswell");
  EXPECT_EQ(preferred_openblas_core(hsw, "Haswell"), "");
  // A CPU without AVX2/FMA keeps whatever the BLAS chose.
  EXPECT_EQ(preferred_openblas_core(cpu("GenuineIntel", 6, 42, 0), "Prescott"), "");
  // A core newer than kqlora knows is kept.
  EXPECT_EQ(preferred_openblas_core(emerald, "GraniteRapids"), "");
  EXPECT_EQ(preferred_openblas_core(hsw, ""), "");
}

TEST(BlasSelection, CpuidAgreesWithTheCompilersDetection) {
  const auto& f = kqlora::cpu_features();
  __builtin_cpu_init();
  EXPECT_EQ(f.avx2, bool(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma, bool(__builtin_cpu_supports("fma")));
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  EXPECT_EQ(f.avx512, avx512);
  EXPECT_EQ(f.vendor == "AuthenticAMD", bool(__builtin_cpu_is("amd")));
  EXPECT_EQ(f.vendor == "GenuineIntel", bool(__builtin_cpu_is("intel")));
}

/// Runs a shell command; its stdout and stderr.
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  EXPECT_EQ(pclose(p), 0) << cmd << "\n" << out;
  return out;
}

/// The apps' BLAS lines ("  BLAS: ..." of --version), one per process.
std::vector<std::string> blas_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t at = text.find("BLAS: "); at != std::string::npos; at = text.find("BLAS: ", at + 1))
    lines.push_back(text.substr(at, text.find('\n', at) - at));
  return lines;
}

const std::string bench = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-bench --version";
// The tests run with the user's variables cleared, as a fresh shell would.
const std::string clean =
    "env -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS "
    "-u OMP_NUM_THREADS -u KQLORA_BLAS_AUTOTUNE -u KQLORA_BLAS_REEXEC ";

/// Whether the apps run OpenBLAS (this test program itself links no BLAS).
bool apps_run_openblas() {
  static const bool yes = run(clean + bench).find("BLAS: OpenBLAS") != std::string::npos;
  return yes;
}

int cpus_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

std::string threads_text(int n) {
  return ", " + std::to_string(n) + (n == 1 ? " thread;" : " threads;");
}

TEST(BlasSelection, GenericCoreSeenMakesTheAppReexecuteWithTheRightKernel) {
  if (!apps_run_openblas()) GTEST_SKIP() << "the apps' BLAS is not OpenBLAS";
  const std::string want = preferred_openblas_core(kqlora::cpu_features(), "Prescott");
  const auto lines = blas_lines(run(clean + "KQLORA_BLAS_TEST_CORENAME=Prescott " + bench));
  ASSERT_EQ(lines.size(), 1u);
  if (want.empty()) {  // no AVX2/FMA on this CPU: nothing to choose
    EXPECT_NE(lines[0].find("kernel kept (Prescott"), std::string::npos) << lines[0];
    return;
  }
  // Only the re-executed process sees OPENBLAS_CORETYPE with kqlora's marker, and the BLAS
  // it loaded reports the requested kernel.
  EXPECT_NE(lines[0].find("kernel " + want + ","), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("kernel set by kqlora (OPENBLAS_CORETYPE=" + want +
                          "; the BLAS had chosen Prescott"),
            std::string::npos)
      << lines[0];
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_NE(lines[0].find(threads_text(std::min(cpus_allowed(), online))), std::string::npos)
      << lines[0];
}

TEST(BlasSelection, TheUsersChoicesWin) {
  if (!apps_run_openblas()) GTEST_SKIP() << "the apps' BLAS is not OpenBLAS";
  // OPENBLAS_CORETYPE is honoured by this BLAS and left alone by kqlora.
  auto lines = blas_lines(run(clean + "OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1 " +
                              "KQLORA_BLAS_TEST_CORENAME=Prescott " + bench));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("kernel Prescott, 1 thread; kernel from the user's "
                          "OPENBLAS_CORETYPE=Prescott; threads from OPENBLAS_NUM_THREADS"),
            std::string::npos)
      << lines[0];
  lines = blas_lines(run(clean + "KQLORA_BLAS_AUTOTUNE=0 KQLORA_BLAS_TEST_CORENAME=Prescott " +
                         "GOTO_NUM_THREADS=1 " + bench));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("kernel kept (KQLORA_BLAS_AUTOTUNE=0); threads from GOTO_NUM_THREADS"),
            std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[0].find("set by kqlora"), std::string::npos) << lines[0];
}

#ifdef KQLORA_TEST_MPIEXEC
TEST(BlasSelection, ReexecutionUnderMpiexecSharesTheCores) {
  if (!apps_run_openblas()) GTEST_SKIP() << "the apps' BLAS is not OpenBLAS";
  const std::string want = preferred_openblas_core(kqlora::cpu_features(), "Prescott");
  if (want.empty()) GTEST_SKIP() << "no AVX2/FMA: no kernel to choose";
  // Each of the two ranks re-executes before MPI_Init and still joins the job. This test
  // is a singleton MPI process itself: its launcher variables must not reach mpiexec.
  const std::string no_launcher =
      "env $(env | sed -n 's/^\\(\\(OMPI\\|PMIX\\)_[A-Za-z0-9_]*\\)=.*/-u \\1/p') ";
  const auto lines =
      blas_lines(run(no_launcher + clean + KQLORA_TEST_MPIEXEC +
                     " -np 2 --bind-to none -x KQLORA_BLAS_TEST_CORENAME=Prescott " + bench));
  ASSERT_EQ(lines.size(), 2u);
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  for (const auto& l : lines) {
    EXPECT_NE(l.find("kernel " + want + ","), std::string::npos) << l;
    EXPECT_NE(l.find("kernel set by kqlora"), std::string::npos) << l;
    EXPECT_NE(l.find(threads_text(std::max(1, std::min(cpus_allowed(), online / 2)))),
              std::string::npos)
        << l;
    EXPECT_NE(l.find("/ 2 ranks on this node"), std::string::npos) << l;
  }
}
#endif

}  // namespace
