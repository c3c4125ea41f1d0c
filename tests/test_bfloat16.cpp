// bfloat16 conversions, exhaustively over all 65536 bit patterns, against a float64
// reference written from the IEEE definition (not from the implementation's bit tricks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kqlora/core/bfloat16.hpp"

using kqlora::bfloat16;

namespace {

// The value of a bfloat16 bit pattern from its fields; patterns past the largest finite
// magnitude count as 2^128 (the unbounded-exponent value IEEE rounding compares against).
double reference_value(uint16_t b) {
  const int sign = b >> 15, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0xff)
    v = std::ldexp(1.0, 128);
  else if (exp == 0)
    v = std::ldexp(mant / 128.0, -126);
  else
    v = std::ldexp(1.0 + mant / 128.0, exp - 127);
  return sign ? -v : v;
}

// Nearest bfloat16 to a finite double, ties to the even pattern, by comparing distances.
uint16_t reference_round(double x) {
  // Candidates: the two patterns around x, found by search over magnitude.
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  uint16_t lo = 0;  // largest magnitude pattern with value <= ax
  for (int step = 0x4000; step > 0; step >>= 1) {
    const uint16_t c = lo + step;
    if (c <= 0x7f80 && reference_value(c) <= ax) lo = c;
  }
  if (lo == 0x7f80) return sign | 0x7f80;
  const uint16_t hi = lo + 1;
  const double dlo = ax - reference_value(lo), dhi = reference_value(hi) - ax;
  uint16_t r = (dlo < dhi || (dlo == dhi && (lo & 1) == 0)) ? lo : hi;
  return sign | r;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST(BFloat16, WidensEveryPatternExactly) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = static_cast<float>(bfloat16::from_bits(static_cast<uint16_t>(b)));
    const int exp = (b >> 7) & 0xff, mant = b & 0x7f;
    if (exp == 0xff && mant != 0) {
      EXPECT_TRUE(std::isnan(f)) << b;
    } else if (exp == 0xff) {
      EXPECT_TRUE(std::isinf(f) && std::signbit(f) == bool(b >> 15)) << b;
    } else {
      EXPECT_EQ(static_cast<double>(f), reference_value(static_cast<uint16_t>(b))) << b;
    }
  }
}

TEST(BFloat16, RoundsEveryNeighbourhoodToNearestEven) {
  // For every pattern: its value, the midpoint to the next pattern (a tie), and the floats
  // just either side of the midpoint.
  for (uint32_t b = 0; b < 65536; ++b) {
    if (((b >> 7) & 0xff) == 0xff) continue;  // Inf/NaN handled below
    const uint32_t base = b << 16;
    for (uint32_t off : {0u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = from_bits(base + off);
      if (!std::isfinite(f)) continue;
      ASSERT_EQ(bfloat16(f).bits, reference_round(f)) << std::hex << base + off;
    }
  }
}

TEST(BFloat16, RandomFloatsMatchReference) {
  std::mt19937 gen(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = from_bits(gen());
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(bfloat16(f).bits, reference_round(f)) << f;
  }
}

TEST(BFloat16, KeepsNanAndInfinity) {
  for (uint32_t b = 0; b < 65536; ++b) {
    if (((b >> 7) & 0xff) != 0xff) continue;
    for (uint32_t off : {0u, 1u, 0x8000u, 0xffffu}) {
      const float f = from_bits((b << 16) + off);
      const bfloat16 h(f);
      EXPECT_EQ(std::isnan(static_cast<float>(h)), std::isnan(f)) << std::hex << b;
      EXPECT_EQ(h.bits >> 15, b >> 15) << std::hex << b;
      if (std::isinf(f)) EXPECT_EQ(h.bits, b);
    }
  }
  // Overflow: past the largest finite value by half a step or more rounds to infinity.
  EXPECT_EQ(bfloat16(from_bits(0x7f7f8000u)).bits, 0x7f80);
  EXPECT_EQ(bfloat16(from_bits(0x7f7f7fffu)).bits, 0x7f7f);
}

TEST(BFloat16, FromDoubleRoundsOnce) {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  for (int i = 0; i < 200000; ++i) {
    const double x = u(gen) * std::ldexp(1.0, static_cast<int>(gen() % 40) - 20);
    ASSERT_EQ(kqlora::bf16_from_double(x).bits, reference_round(x)) << x;
  }
  // A double just above a bfloat16 tie whose float rounding lands exactly on the tie:
  // double -> float -> bfloat16 would round to even (down); the correct result is up.
  const double tie = (reference_value(0x3f80) + reference_value(0x3f81)) / 2;
  const double above = tie + std::ldexp(1.0, -40);
  EXPECT_EQ(static_cast<double>(static_cast<float>(above)), tie);
  EXPECT_EQ(kqlora::bf16_from_double(above).bits, 0x3f81);
  EXPECT_EQ(bfloat16(static_cast<float>(above)).bits, 0x3f80);
}
