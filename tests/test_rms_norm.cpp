// RMSNorm (nn/rms_norm.hpp) against float64: the forward against the formula of Hugging
// Face's LlamaRMSNorm, the input gradient against central finite differences of
// L = sum(gy * y), on every enabled execution space.
#include <gtest/gtest.h>

#include <cmath>

#include "exec_spaces.hpp"
#include "kqlora/nn/rms_norm.hpp"
#include "matrix_util.hpp"
#include "nf4_test_util.hpp"

namespace {

using kqlora_test::matrix;

// y of one row in float64.
std::vector<double> reference(const std::vector<double>& x, const std::vector<float>& w,
                              double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t f = 0; f < x.size(); ++f) y[f] = w[f] * x[f] * r;
  return y;
}

}  // namespace

template <class E>
class RmsNorm : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNorm, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

TYPED_TEST(RmsNorm, ForwardAndInputGradientMatchFloat64) {
  using M = typename TypeParam::memory_space;
  const int64_t T = 5, F = 72;  // F: not a multiple of any vector width
  const float eps = 1e-5f;
  const auto xf = nf4test::randn(T * F, 1), gf = nf4test::randn(T * F, 2);
  auto wf = nf4test::randn(F, 3, 0.5f);
  for (auto& v : wf) v += 1.0f;
  Kokkos::View<float*, M> w("w", F), inv("inv", T);
  Kokkos::deep_copy(w, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           wf.data(), wf.size()));
  auto x = matrix<M>(xf, T, F), gy = matrix<M>(gf, T, F);
  kqlora::Matrix<M> y("y", T, F), gx("gx", T, F);
  kqlora::rms_norm_forward(TypeParam(), x, Kokkos::View<const float*, M>(w), eps, false, y, inv);
  kqlora::rms_norm_backward(TypeParam(), x, Kokkos::View<const float*, M>(w),
                            Kokkos::View<const float*, M>(inv), gy, gx);
  auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto gh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gx);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> row(xf.begin() + t * F, xf.begin() + (t + 1) * F);
    const auto ref = reference(row, wf, eps);
    for (int64_t f = 0; f < F; ++f) ASSERT_NEAR(yh(t, f), ref[f], 1e-5 * (1 + std::fabs(ref[f])));
    // dL/dx_f of L = sum_g gy_g y_g, by central differences in float64.
    for (int64_t f = 0; f < F; ++f) {
      const double h = 1e-6, keep = row[f];
      double lp = 0, lm = 0;
      row[f] = keep + h;
      auto yp = reference(row, wf, eps);
      row[f] = keep - h;
      auto ym = reference(row, wf, eps);
      row[f] = keep;
      for (int64_t g = 0; g < F; ++g) {
        lp += gf[t * F + g] * yp[g];
        lm += gf[t * F + g] * ym[g];
      }
      const double fd = (lp - lm) / (2 * h);
      ASSERT_NEAR(gh(t, f), fd, 1e-4 * (1 + std::fabs(fd))) << t << "," << f;
    }
  }
}

TYPED_TEST(RmsNorm, Bfloat16RoundsTheNormalisedInputAndTheOutput) {
  using M = typename TypeParam::memory_space;
  const int64_t T = 3, F = 40;
  const auto xf = nf4test::randn(T * F, 4);
  const auto wf = nf4test::randn(F, 5);
  Kokkos::View<float*, M> w("w", F), inv("inv", T);
  Kokkos::deep_copy(w, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           wf.data(), wf.size()));
  auto x = matrix<M>(xf, T, F);
  kqlora::Matrix<M> y("y", T, F);
  kqlora::rms_norm_forward(TypeParam(), x, Kokkos::View<const float*, M>(w), 1e-6f, true, y, inv);
  auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto ih = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), inv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t f = 0; f < F; ++f) {
      // PyTorch: (x * inv).to(bfloat16), then w * that in bfloat16.
      const float n = kqlora::round_to_bf16(xf[t * F + f] * ih(t));
      ASSERT_EQ(yh(t, f), kqlora::round_to_bf16(wf[f] * n)) << t << "," << f;
    }
}

// NormGradOut::add: gx += the input gradient in the same pass (the residual stream's
// gradient), against the written gradient plus gx's values in float64; in bfloat16 the sum
// rounded once, as residual_add rounds it.
TYPED_TEST(RmsNorm, AddedInputGradientIsTheWrittenOnePlusTheStream) {
  using M = typename TypeParam::memory_space;
  const int64_t T = 4, F = 72;
  const auto xf = nf4test::randn(T * F, 6), gf = nf4test::randn(T * F, 7),
             sf = nf4test::randn(T * F, 8);
  const auto wf = nf4test::randn(F, 9);
  Kokkos::View<float*, M> w("w", F), inv("inv", T);
  Kokkos::deep_copy(w, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           wf.data(), wf.size()));
  auto x = matrix<M>(xf, T, F), gy = matrix<M>(gf, T, F);
  kqlora::Matrix<M> y("y", T, F), written("written", T, F);
  kqlora::rms_norm_forward(TypeParam(), x, Kokkos::View<const float*, M>(w), 1e-6f, false, y, inv);
  const Kokkos::View<const float*, M> wc(w), ic(inv);
  kqlora::rms_norm_backward(TypeParam(), x, wc, ic, gy, written);
  auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), written);
  for (const bool bf16 : {false, true}) {
    auto added = matrix<M>(sf, T, F);
    kqlora::rms_norm_backward(TypeParam(), x, wc, ic, gy, added, kqlora::NormKind::scale,
                              kqlora::NormGradOut::add, bf16);
    auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), added);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        const double want = static_cast<double>(sf[t * F + f]) + wh(t, f);
        const double a = std::fabs(sf[t * F + f]) + std::fabs(wh(t, f));
        if (bf16) {
          ASSERT_EQ(ah(t, f), kqlora::round_to_bf16(ah(t, f))) << t << "," << f;
          ASSERT_NEAR(ah(t, f), want, std::ldexp(std::fabs(want), -8) + 1e-6 * a) << t << "," << f;
        } else {
          ASSERT_NEAR(ah(t, f), want, 1e-6 * a + 1e-30) << t << "," << f;
        }
      }
  }
}
