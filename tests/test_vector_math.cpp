// fast_exp against double exp over the float range, and the row loops' sums and maxima
// against float64 over lengths and offsets that are not multiples of their lanes, in a
// team kernel on every enabled execution space.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "exec_spaces.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace {

// |f - exact| in units of the float spacing at exact.
double ulps(float f, double exact) {
  const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
  return std::fabs(static_cast<double>(f) - exact) / ulp;
}

TEST(FastExp, WithinTwoUlpOfExpOverTheNormalRange) {
  double worst = 0;
  float at = 0;
  int n = 0;
  // Every float in [-87.33, 88.72] is too many; a geometric walk through about a million
  // of them, plus the integers and the neighbourhood of 0.
  for (float x = -87.33f; x < 88.72f; ++n) {
    const double e = ulps(kqlora::fast_exp(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, at = x;
    const float step = std::max(std::fabs(x) * 2e-5f, 1e-7f);
    x = std::nextafter(x + step, 100.0f);
  }
  EXPECT_GT(n, 1000000);
  EXPECT_LE(worst, 2.0) << "at x = " << at;
  for (int k = -87; k <= 88; ++k)
    EXPECT_LE(ulps(kqlora::fast_exp(static_cast<float>(k)), std::exp(static_cast<double>(k))), 2.0)
        << k;
  EXPECT_EQ(kqlora::fast_exp(0.0f), 1.0f);
}

TEST(FastExp, LimitsAndNaN) {
  EXPECT_EQ(kqlora::fast_exp(-INFINITY), 0.0f);
  EXPECT_EQ(kqlora::fast_exp(-100.0f), 0.0f);  // (below the normal range: flushed)
  EXPECT_EQ(kqlora::fast_exp(89.0f), INFINITY);
  EXPECT_EQ(kqlora::fast_exp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(kqlora::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  // The largest finite results are not lost to the split of 2^n.
  EXPECT_LE(ulps(kqlora::fast_exp(88.7f), std::exp(static_cast<double>(88.7f))), 2.0);
}

TEST(FastExp, TanhViaExpIsWithinItsAbsoluteBound) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const double u = i * 1e-4;  // [-20, 20]
    worst = std::max(worst, std::fabs(kqlora::tanh_via_exp(static_cast<float>(u)) - std::tanh(u)));
  }
  EXPECT_LE(worst, 2.5e-7);
}

// fast_tanh (the final soft-cap's) within a few ulp of double tanh: relative on the series
// side (|z| < 1/2, down to the smallest values) and across the switch, over [-20, 20].
TEST(FastExp, FastTanhWithinFourUlpOfTanh) {
  double worst = 0;
  float at = 0;
  for (float z = 1e-30f; z < 20.0f;) {
    for (float s : {z, -z}) {
      const double exact = std::tanh(static_cast<double>(s));
      const double e = ulps(kqlora::fast_tanh(s), exact);
      if (e > worst) worst = e, at = s;
    }
    z = std::nextafter(z + std::max(z * 1e-5f, 1e-9f), 100.0f);
  }
  EXPECT_LE(worst, 4.0) << "at z = " << at;
  EXPECT_EQ(kqlora::fast_tanh(0.0f), 0.0f);
  EXPECT_EQ(kqlora::fast_tanh(40.0f), 1.0f);
  EXPECT_EQ(kqlora::fast_tanh(-40.0f), -1.0f);
}

/// Rows of W normal values (sd 4; hx on the host, x to be copied from it) and each row's
/// range length in len (on the device already).
template <class Mem>
struct RandomRows {
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x;
  Kokkos::View<int64_t*, Mem> len;
  typename Kokkos::View<float**, Kokkos::LayoutRight, Mem>::HostMirror hx;
  RandomRows(const std::vector<int64_t>& lens, int64_t W, unsigned seed)
      : x("x", lens.size(), W), len("len", lens.size()), hx(Kokkos::create_mirror(x)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 4.0f);
    auto hl = Kokkos::create_mirror_view(len);
    for (size_t r = 0; r < lens.size(); ++r) {
      hl(r) = lens[r];
      for (int64_t j = 0; j < W; ++j) hx(r, j) = nd(rng);
    }
    Kokkos::deep_copy(len, hl);
  }
};

// Each row's sum and max over [lo, hi) into out, then that range doubled in place (a free
// function: CUDA's lambdas may not live in a test's private body).
template <class Exec, class X, class L, class O>
void run_row_loops(const X& x, const L& len, const O& out) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Exec>(static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& t) {
        const int64_t r = t.league_rank(), lo = r % 5, hi = lo + len(r);
        const float s = kqlora::row_sum(t, lo, hi, [&](int64_t j) { return x(r, j); });
        const float m = kqlora::row_max(t, lo, hi, [&](int64_t j) { return x(r, j); });
        t.team_barrier();
        kqlora::row_for(t, lo, hi, [&](int64_t j) { x(r, j) = 2.0f * x(r, j); });
        Kokkos::single(Kokkos::PerTeam(t), [&] {
          out(r, 0) = s;
          out(r, 1) = m;
        });
      });
}

// The pointer passes of a row: out = (max, sum of exp(x - max)) over [lo, hi), the range
// replaced by exp(x - max) / sum, 7 before it and -1 after it.
template <class Exec, class X, class L, class O>
void run_row_passes(const X& x, const L& len, const O& out) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Exec>(static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& t) {
        const int64_t r = t.league_rank(), lo = r % 5, hi = lo + len(r);
        float* p = &x(r, 0);
        const float m = kqlora::row_max(t, p, lo, hi);
        kqlora::row_exp(t, p, lo, hi, m);
        t.team_barrier();
        const float z = kqlora::row_sum(t, p, lo, hi);
        kqlora::row_scale(t, p, lo, hi, 1.0f / z);
        kqlora::row_fill(t, p, 0, lo, 7.0f);
        kqlora::row_fill(t, p, hi, static_cast<int64_t>(x.extent(1)), -1.0f);
        Kokkos::single(Kokkos::PerTeam(t), [&] {
          out(r, 0) = m;
          out(r, 1) = z;
        });
      });
}

template <class Space>
class RowLoops : public ::testing::Test {};
TYPED_TEST_SUITE(RowLoops, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

TYPED_TEST(RowLoops, SumAndMaxOfEachRowMatchFloat64) {
  using Exec = TypeParam;
  using Mem = typename Exec::memory_space;
  // Rows of different lengths, each over [lo, hi): lo = r % 5, hi = lo + len.
  const std::vector<int64_t> lens = {0, 1, 7, 15, 16, 17, 31, 33, 100, 257};
  const int64_t R = static_cast<int64_t>(lens.size()), W = 264;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", R, W);
  Kokkos::View<int64_t*, Mem> len("len", R);
  auto hx = Kokkos::create_mirror(x);  // (a copy: the kernel changes x)
  auto hl = Kokkos::create_mirror_view(len);
  for (int64_t r = 0; r < R; ++r) {
    hl(r) = lens[r];
    for (int64_t j = 0; j < W; ++j) hx(r, j) = nd(rng);
  }
  Kokkos::deep_copy(x, hx);
  Kokkos::deep_copy(len, hl);
  Kokkos::View<float* [2], Mem> out("out", R);
  run_row_loops<Exec>(x, len, out);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  auto hx2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t lo = r % 5, hi = lo + lens[r];
    double s = 0, a = 0;
    float m = -INFINITY;
    for (int64_t j = lo; j < hi; ++j) {
      s += hx(r, j);
      a += std::fabs(hx(r, j));
      m = std::max(m, hx(r, j));
    }
    EXPECT_NEAR(ho(r, 0), s, 1e-6 * a + 1e-30) << "row " << r;
    EXPECT_EQ(ho(r, 1), m) << "row " << r;
    for (int64_t j = 0; j < W; ++j)
      EXPECT_EQ(hx2(r, j), (j >= lo && j < hi ? 2.0f : 1.0f) * hx(r, j)) << r << ", " << j;
  }
}

TYPED_TEST(RowLoops, SoftmaxPassesOverARowPointerMatchFloat64) {
  using Exec = TypeParam;
  using Mem = typename Exec::memory_space;
  // Lengths around the 16-lane blocks; one row holds -inf (a masked score) and the largest
  // value in its tail.
  const std::vector<int64_t> lens = {1, 7, 15, 16, 17, 31, 33, 100, 257};
  const int64_t R = static_cast<int64_t>(lens.size()), W = 264;
  RandomRows<Mem> rows(lens, W, 5);
  auto& x = rows.x;
  auto& len = rows.len;
  auto& hx = rows.hx;
  hx(7, 2 + 3) = -INFINITY;
  hx(7, 2 + 99) = 40.0f;
  Kokkos::deep_copy(x, hx);
  Kokkos::View<float* [2], Mem> out("out", R);
  run_row_passes<Exec>(x, len, out);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t lo = r % 5, hi = lo + lens[r];
    double m = -INFINITY, z = 0;
    for (int64_t j = lo; j < hi; ++j) m = std::max<double>(m, hx(r, j));
    for (int64_t j = lo; j < hi; ++j) z += std::exp(static_cast<double>(hx(r, j)) - m);
    EXPECT_EQ(ho(r, 0), static_cast<float>(m)) << "row " << r;
    EXPECT_NEAR(ho(r, 1), z, 1e-6 * z) << "row " << r;
    for (int64_t j = 0; j < W; ++j) {
      const double d = j >= lo && j < hi ? static_cast<double>(hx(r, j)) - m : 0.0;
      const double want = j < lo ? 7.0 : j >= hi ? -1.0 : std::exp(d) / z;
      // (x - max is rounded to float first: a relative error of |x - max| ulp(1) / 2)
      const double tol = want == 0.0 ? 0.0 : (2e-6 + 6e-8 * std::fabs(d)) * std::fabs(want);
      EXPECT_NEAR(hp(r, j), want, tol + 1e-37) << r << ", " << j;
    }
  }
}

// row_exp alone: each row's [lo, hi) replaced by exp(x - shift), every other entry left as
// it was (the tail past the 16-lane blocks goes through a full vector of its own).
template <class Exec, class X, class L>
void run_row_exp(const X& x, const L& len, float shift) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Exec>(static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& t) {
        const int64_t r = t.league_rank(), lo = r % 5, hi = lo + len(r);
        kqlora::row_exp(t, &x(r, 0), lo, hi, shift);
      });
}

TYPED_TEST(RowLoops, ExpOfARangeMatchesFloat64AndLeavesTheRestOfTheRow) {
  using Exec = TypeParam;
  using Mem = typename Exec::memory_space;
  const std::vector<int64_t> lens = {0, 1, 2, 7, 15, 16, 17, 30, 31, 32, 33, 47, 100, 257};
  const int64_t R = static_cast<int64_t>(lens.size()), W = 264;
  const float shift = 1.5f;
  RandomRows<Mem> rows(lens, W, 11);
  auto& x = rows.x;
  auto& len = rows.len;
  auto& hx = rows.hx;
  Kokkos::deep_copy(x, hx);
  run_row_exp<Exec>(x, len, shift);
  auto he = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t lo = r % 5, hi = lo + lens[r];
    for (int64_t j = 0; j < W; ++j) {
      if (j < lo || j >= hi) {
        EXPECT_EQ(he(r, j), hx(r, j)) << "outside the range: " << r << ", " << j;
        continue;
      }
      const float d = hx(r, j) - shift;  // (the difference is rounded to float first)
      EXPECT_LE(ulps(he(r, j), std::exp(static_cast<double>(d))), 2.0) << r << ", " << j;
    }
  }
}

}  // namespace
