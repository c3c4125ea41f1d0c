#pragma once
// Gradients against central differences of a float64 reference (the Gated DeltaNet tests):
// each element of one input field of a case perturbed by +-1e-6, the loss recomputed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace kqlora_test {

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

/// `grad` (the kernel's gradient of field `field` of `in`) within 1e-4 of the largest
/// central difference of loss(case) over that field; prints the relative difference.
template <class Case, class Loss>
void expect_matches_central_differences(const Case& in, std::vector<double> Case::*field,
                                        const std::vector<double>& grad, const char* name,
                                        const Loss& loss) {
  Case x = in;
  std::vector<double> fd((x.*field).size());
  const double step = 1e-6;
  for (size_t i = 0; i < fd.size(); ++i) {
    const double keep = (x.*field)[i];
    (x.*field)[i] = keep + step;
    const double up = loss(x);
    (x.*field)[i] = keep - step;
    fd[i] = (up - loss(x)) / (2 * step);
    (x.*field)[i] = keep;
  }
  ASSERT_EQ(grad.size(), fd.size()) << name;
  std::printf("%s: %.3g of the largest\n", name, max_diff(grad, fd) / max_abs(fd));
  EXPECT_LE(max_diff(grad, fd), 1e-4 * max_abs(fd)) << name;
  EXPECT_GT(max_abs(fd), 0.0) << name;
}

}  // namespace kqlora_test
