// The host GEMM engines (core/gemm_engine.hpp) against float64 products, for every
// transpose and every operand layout gemm() accepts (row-major, column-major, a column
// block of a row-major matrix), the bfloat16 products too where this CPU has them (AMX, AMD's
// AVX512_BF16); and
// KQLORA_GEMM and KQLORA_AMX as the apps read them.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <cstdio>
#include <random>
#include <string>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/blas.hpp"
#include "kqlora/core/gemm_calls.hpp"
#include "kqlora/core/gemm_engine.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using RowMajor = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using ColMajor = Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace>;

// op(X)(i, j) for a view X.
template <class V>
double at(const V& x, bool t, int64_t i, int64_t j) {
  return t ? x(j, i) : x(i, j);
}

/// gemm into c (holding `c0` first) against float64: alpha op(a) op(b) + beta c0.
template <class A, class B, class C>
void expect_product(bool ta, bool tb, const A& a, const B& b, const C& c, const std::string& what,
                    kqlora::GemmInputs inputs = kqlora::GemmInputs::float32) {
  const int64_t m = c.extent(0), n = c.extent(1), k = ta ? a.extent(0) : a.extent(1);
  std::vector<double> c0(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c0[i * n + j] = c(i, j);
  const float alpha = 0.75f, beta = -0.5f;
  kqlora::gemm(Host(), ta ? "T" : "N", tb ? "T" : "N", alpha, a, b, beta, c, inputs);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        s += at(a, ta, i, l) * at(b, tb, l, j);
        mag += std::fabs(at(a, ta, i, l) * at(b, tb, l, j));
      }
      const double want = alpha * s + beta * c0[i * n + j];
      ASSERT_NEAR(c(i, j), want, 1e-5 * (mag + std::fabs(c0[i * n + j])) + 1e-6)
          << what << " (" << i << ", " << j << ")";
    }
}

template <class V>
void fill(const V& v, std::mt19937& rng, bool bf16 = false) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < v.extent(0); ++i)
    for (size_t j = 0; j < v.extent(1); ++j)
      v(i, j) = bf16 ? kqlora::round_to_bf16(u(rng)) : u(rng);
}

class GemmEngines : public ::testing::TestWithParam<kqlora::GemmEngine> {
 protected:
  void SetUp() override {
    if (GetParam() == kqlora::GemmEngine::onednn && !kqlora::onednn_available())
      GTEST_SKIP() << "built without oneDNN";
    was_ = kqlora::host_gemm_engine();
    kqlora::set_host_gemm_engine(GetParam());
  }
  void TearDown() override { kqlora::set_host_gemm_engine(was_); }
  kqlora::GemmEngine was_ = kqlora::GemmEngine::blas;
};

TEST_P(GemmEngines, EveryTransposeAndLayoutMatchesFloat64) {
  std::mt19937 rng(7);
  const int64_t m = 13, n = 9, k = 21;  // (no multiple of a vector width)
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string ops = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      // Row-major operands.
      RowMajor a("a", ta ? k : m, ta ? m : k), b("b", tb ? n : k, tb ? k : n), c("c", m, n);
      fill(a, rng), fill(b, rng), fill(c, rng);
      expect_product(ta, tb, a, b, c, ops + " row-major");
      // Column-major operands and result.
      ColMajor al("al", a.extent(0), a.extent(1)), bl("bl", b.extent(0), b.extent(1)),
          cl("cl", m, n);
      fill(al, rng), fill(bl, rng), fill(cl, rng);
      expect_product(ta, tb, al, bl, cl, ops + " column-major");
      expect_product(ta, tb, a, bl, cl, ops + " row-major A, column-major B and C");
      // Column blocks of wider row-major matrices (leading dimension past the width).
      RowMajor aw("aw", a.extent(0), a.extent(1) + 5), bw("bw", b.extent(0), b.extent(1) + 3),
          cw("cw", m, n + 4);
      fill(aw, rng), fill(bw, rng), fill(cw, rng);
      const auto as = Kokkos::subview(aw, Kokkos::ALL, std::make_pair(size_t(2), 2 + a.extent(1)));
      const auto bs = Kokkos::subview(bw, Kokkos::ALL, std::make_pair(size_t(1), 1 + b.extent(1)));
      const auto cs = Kokkos::subview(cw, Kokkos::ALL, std::make_pair(int64_t(3), 3 + n));
      expect_product(ta, tb, as, bs, cs, ops + " column blocks");
    }
}

INSTANTIATE_TEST_SUITE_P(Host, GemmEngines,
                         ::testing::Values(kqlora::GemmEngine::blas, kqlora::GemmEngine::onednn),
                         [](const auto& info) {
                           return info.param == kqlora::GemmEngine::blas ? "blas" : "onednn";
                         });

/// The bfloat16 products (host_bf16_products()): skipped on a CPU without them.
class Bf16Products : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kqlora::host_bf16_products_available())
      GTEST_SKIP()
          << "oneDNN has no bfloat16 products on this CPU (AMX, AMD AVX512_BF16; or no oneDNN)";
    engine_ = kqlora::host_gemm_engine();
    on_ = kqlora::host_bf16_products();
    kqlora::set_host_gemm_engine(kqlora::GemmEngine::onednn);
    kqlora::set_host_bf16_products(true);
  }
  void TearDown() override {
    if (!kqlora::host_bf16_products_available()) return;
    kqlora::set_host_gemm_engine(engine_);
    kqlora::set_host_bf16_products(on_);
  }
  kqlora::GemmEngine engine_ = kqlora::GemmEngine::blas;
  bool on_ = false;
};

TEST_F(Bf16Products, EveryTransposeAndLayoutMatchesFloat64) {
  ASSERT_TRUE(kqlora::host_bf16_products());
  std::mt19937 rng(11);
  const auto bf16 = kqlora::GemmInputs::bfloat16;
  const int64_t m = 13, n = 9,
                k = 37;  // (k past one AMX tile's 32, odd: half a pair of AVX512_BF16's)
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string ops = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      RowMajor a("a", ta ? k : m, ta ? m : k), b("b", tb ? n : k, tb ? k : n), c("c", m, n);
      fill(a, rng, true), fill(b, rng, true), fill(c, rng);
      expect_product(ta, tb, a, b, c, ops + " row-major", bf16);
      ColMajor al("al", a.extent(0), a.extent(1)), bl("bl", b.extent(0), b.extent(1)),
          cl("cl", m, n);
      fill(al, rng, true), fill(bl, rng, true), fill(cl, rng);
      expect_product(ta, tb, al, bl, cl, ops + " column-major", bf16);
      RowMajor aw("aw", a.extent(0), a.extent(1) + 5), bw("bw", b.extent(0), b.extent(1) + 3),
          cw("cw", m, n + 4);
      fill(aw, rng, true), fill(bw, rng, true), fill(cw, rng);
      const auto as = Kokkos::subview(aw, Kokkos::ALL, std::make_pair(size_t(2), 2 + a.extent(1)));
      const auto bs = Kokkos::subview(bw, Kokkos::ALL, std::make_pair(size_t(1), 1 + b.extent(1)));
      const auto cs = Kokkos::subview(cw, Kokkos::ALL, std::make_pair(int64_t(3), 3 + n));
      expect_product(ta, tb, as, bs, cs, ops + " column blocks", bf16);
    }
}

// A summed index longer than one block of the 16-bit copies (4 MiB of B: 960 of it at
// n = 2100), with a tail, and beta applied once.
TEST_F(Bf16Products, ALongSummedIndexRunsInBlocksAndMatchesFloat64) {
  std::mt19937 rng(12);
  const int64_t m = 3, n = 2100, k = 2000;
  for (bool tb : {false, true}) {
    RowMajor a("a", m, k), b("b", tb ? n : k, tb ? k : n), c("c", m, n);
    fill(a, rng, true), fill(b, rng, true), fill(c, rng);
    expect_product(false, tb, a, b, c, tb ? "NT" : "NN", kqlora::GemmInputs::bfloat16);
  }
}

// A weight given as its 16-bit bits (an NF4 panel, the LM head's copy) gives the product
// of the same weight given as float32 bfloat16 values, bit for bit.
TEST_F(Bf16Products, SixteenBitWeightEqualsTheFloatOperand) {
  std::mt19937 rng(13);
  const int64_t m = 17, n = 40, k = 70;
  for (bool tb : {false, true}) {
    RowMajor a("a", m, k), w("w", tb ? n : k, tb ? k : n), c1("c1", m, n), c2("c2", m, n);
    fill(a, rng, true), fill(w, rng, true), fill(c1, rng);
    Kokkos::deep_copy(c2, c1);
    std::vector<uint16_t> bits(w.size());
    for (size_t i = 0; i < w.size(); ++i) bits[i] = kqlora::bfloat16::round_bits(w.data()[i]);
    kqlora::gemm(Host(), "N", tb ? "T" : "N", 0.5f, a, w, 2.0f, c1, kqlora::GemmInputs::bfloat16);
    kqlora::gemm_bf16_weight("N", tb ? "T" : "N", 0.5f, a, bits.data(), w.extent(0), w.extent(1),
                             w.extent(1), 2.0f, c2);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(c1(i, j), c2(i, j)) << i << ", " << j;
  }
}

// A 16-bit weight over a summed index longer than the block it is read in (8192), with
// a tail, against float64: the LM head's backward (logit gradients times the head).
TEST_F(Bf16Products, SixteenBitWeightOverALongSummedIndexMatchesFloat64) {
  std::mt19937 rng(14);
  const int64_t m = 3, n = 24, k = 8192 + 1000;
  RowMajor a("a", m, k), w("w", k, n), c("c", m, n);
  fill(a, rng, true), fill(w, rng, true), fill(c, rng);
  std::vector<double> c0(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c0[i * n + j] = c(i, j);
  std::vector<uint16_t> bits(w.size());
  for (size_t i = 0; i < w.size(); ++i) bits[i] = kqlora::bfloat16::round_bits(w.data()[i]);
  kqlora::gemm_bf16_weight("N", "N", 1.0f, a, bits.data(), k, n, n, -1.0f, c);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        s += double(a(i, l)) * w(l, j);
        mag += std::fabs(double(a(i, l)) * w(l, j));
      }
      ASSERT_NEAR(c(i, j), s - c0[i * n + j], 1e-5 * (mag + std::fabs(c0[i * n + j])))
          << i << ", " << j;
    }
}

/// Runs a shell command: its exit status and output.
std::pair<int, std::string> run_app(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  while (size_t got = fread(buf, 1, sizeof buf, p)) out.append(buf, got);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(GemmEngineChoice, TheAppsNameItAndRefuseAnUnknownOne) {
  const std::string app = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-bench --version";
  auto [rc, out] = run_app("KQLORA_GEMM=blas " + app);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("GEMM engine: BLAS"), std::string::npos) << out;
  EXPECT_NE(out.find("KQLORA_GEMM=blas"), std::string::npos) << out;
  std::tie(rc, out) = run_app("KQLORA_GEMM=mkl " + app);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("KQLORA_GEMM=mkl: expected blas or onednn"), std::string::npos) << out;
  std::tie(rc, out) = run_app("env -u KQLORA_GEMM " + app);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(kqlora::onednn_available() ? "GEMM engine: oneDNN" : "GEMM engine: BLAS"),
            std::string::npos)
      << out;
}

TEST(GemmEngineChoice, KqloraAmxIsReadAndNamed) {
  const std::string app = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-bench --version";
  auto [rc, out] = run_app("KQLORA_AMX=yes " + app);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("KQLORA_AMX=yes: expected on or off"), std::string::npos) << out;
  std::tie(rc, out) = run_app("KQLORA_AMX=off " + app);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("bfloat16 products: float32"), std::string::npos) << out;
  std::tie(rc, out) = run_app("env -u KQLORA_AMX -u KQLORA_GEMM " + app);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(kqlora::host_bf16_products_available()
                         ? "bfloat16 products: " + kqlora::host_bf16_products_unit() + " (oneDNN"
                         : std::string("bfloat16 products: float32")),
            std::string::npos)
      << out;
}

// gemm_calls() counts the vendor calls: one per product on every engine and layout
// (the fallback through Kokkos Kernels for a layout the BLAS cannot take too), none for an
// empty product, one per product of a host batch (a gemm each: on CUDA one batched call).
TEST(GemmCalls, OneCountPerVendorCall) {
  std::mt19937 rng(3);
  RowMajor a("a", 5, 4), b("b", 4, 6), c("c", 5, 6);
  fill(a, rng);
  fill(b, rng);
  const uint64_t before = kqlora::gemm_calls();
  for (auto e : {kqlora::GemmEngine::blas, kqlora::GemmEngine::onednn}) {
    if (e == kqlora::GemmEngine::onednn && !kqlora::onednn_available()) continue;
    kqlora::set_host_gemm_engine(e);
    const uint64_t n0 = kqlora::gemm_calls();
    kqlora::gemm(Host(), "N", "N", 1.0f, a, b, 0.0f, c);
    kqlora::gemm(Host(), "T", "N", 1.0f, ColMajor("at", 4, 5), b, 0.0f, c);
    EXPECT_EQ(kqlora::gemm_calls() - n0, 2u);
    // An empty product calls nothing.
    kqlora::gemm(Host(), "N", "N", 1.0f, RowMajor("a0", 0, 4), b, 0.0f, RowMajor("c0", 0, 6));
    EXPECT_EQ(kqlora::gemm_calls() - n0, 2u);
  }
  kqlora::select_gemm_engine();  // (the default back)
  // A strided view the BLAS cannot take (neither stride 1): Kokkos Kernels' gemm, counted.
  Kokkos::View<float**, Kokkos::LayoutStride, Kokkos::HostSpace> s(
      "s", Kokkos::LayoutStride(5, 8, 4, 2));
  const uint64_t n1 = kqlora::gemm_calls();
  kqlora::gemm(Host(), "N", "N", 1.0f, s, b, 0.0f, c);
  EXPECT_EQ(kqlora::gemm_calls() - n1, 1u);
  // A batch of 3 on the host: 3 calls.
  RowMajor ab("ab", 15, 4), cb("cb", 15, 6);
  const uint64_t n2 = kqlora::gemm_calls();
  kqlora::gemm_strided_batched(Host(), "N", "N", 1.0f, RowMajor(ab.data(), 5, 4), 20, b, 0, 0.0f,
                               RowMajor(cb.data(), 5, 6), 30, 3);
  EXPECT_EQ(kqlora::gemm_calls() - n2, 3u);
  EXPECT_EQ(kqlora::gemm_calls() - before, (kqlora::onednn_available() ? 4u : 2u) + 1u + 3u);
}

}  // namespace
