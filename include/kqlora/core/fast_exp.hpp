#pragma once
// exp for float32 as a short inline polynomial, so that loops over it vectorise: libm's
// expf is a call per element, and the softmaxes, the cross-entropy and SiLU of a training
// step spent about a tenth of the step in it (docs/BENCHMARKS.md). Within 2 ulp of the
// exact exponential (tests/test_fast_exp.cpp, against double exp over the float range);
// results below the smallest normal float (x < -87.3365) are 0, above FLT_MAX +inf, NaN
// stays NaN.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/core/bit_cast.hpp"

namespace kqlora {

KOKKOS_FORCEINLINE_FUNCTION float fast_exp(float x) {
  // exp(x) = 2^n exp(r): n = round(x / ln 2), r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2], with
  // ln 2 split in two so that n * (its high part) is exact.
  const float lo = -87.3365479f, hi = 88.7228394f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.44269504f + shifter) - shifter;
  float r = fmaf(n, -0.693145752f, xc);
  r = fmaf(n, -1.42860677e-06f, r);
  // exp(r) by its Taylor series to r^7 (the remainder is under 6e-9 relative).
  float p = 1.98412698e-4f;
  p = fmaf(p, r, 1.38888889e-3f);
  p = fmaf(p, r, 8.33333333e-3f);
  p = fmaf(p, r, 4.16666667e-2f);
  p = fmaf(p, r, 1.66666667e-1f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  // 2^n in two factors: n reaches 128, past the largest float exponent.
  const int32_t k = static_cast<int32_t>(n), k1 = k / 2;
  const float s1 = bit_cast<float>(static_cast<uint32_t>(k1 + 127) << 23);
  const float s2 = bit_cast<float>(static_cast<uint32_t>(k - k1 + 127) << 23);
  const float e = p * s1 * s2;
  return x < lo ? 0.0f : (x > hi ? INFINITY : (x != x ? x : e));
}

}  // namespace kqlora
