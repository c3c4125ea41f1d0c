#pragma once
// kqlora's counter-based random generator (docs/TRAINING.md, "The model"): every value is a pure
// function of (seed, stream, index), so any rank computes any value on its own and a step's global
// batch is the same whatever the world size. The mixing is SplitMix64's finaliser applied
// twice with the key folded in between (statistically sound for initialisation and
// synthetic data; not for cryptography).

#include <Kokkos_Macros.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/core/bit_cast.hpp"

namespace kqlora {

/// Streams: one per kind of random value, offset by the layer where there is one.
enum class RandomStream : uint64_t {
  base_weight = 1ull << 32,
  lora_a = 2ull << 32,
  lora_b = 3ull << 32,
  bias = 4ull << 32,
  inputs = 5ull << 32,
  targets = 6ull << 32,
  dropout = 7ull << 32,
  shuffle = 8ull << 32,  // + the epoch
};

KOKKOS_INLINE_FUNCTION uint64_t random_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64 random bits for (seed, stream, index).
KOKKOS_INLINE_FUNCTION uint64_t random_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t key = random_mix(seed * 0x9e3779b97f4a7c15ull + stream);
  return random_mix(random_mix(index + key) ^ (key * 0xd1b54a32d192ed03ull));
}

/// Uniform in [0, 1) with 53 random bits.
KOKKOS_INLINE_FUNCTION double random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<double>(random_bits(seed, stream, index) >> 11) * 0x1.0p-53;
}

namespace impl {

/// An integer below 2^52 as a double, exactly: its bits under the exponent of 2^52, minus
/// 2^52. The same value as a conversion instruction gives, but one that AVX2 vectorises
/// (it has no 64-bit integer to double conversion).
KOKKOS_INLINE_FUNCTION double random_small_to_double(uint64_t v) {
  return bit_cast<double>(v | 0x4330000000000000ull) - 4503599627370496.0;
}

/// log(x) for x in (0, 1] in plain double arithmetic (no libm): the same bits wherever it
/// runs, and a loop over it vectorises. x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
/// log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172, by its series to s^25.
KOKKOS_INLINE_FUNCTION double random_log(double x) {
  const uint64_t b = bit_cast<uint64_t>(x);
  double e = random_small_to_double((b >> 52) & 0x7ff) - 1023.0;
  double m = bit_cast<double>((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  const bool high = m > 1.4142135623730951;
  m = high ? 0.5 * m : m;
  e = high ? e + 1.0 : e;
  const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double p = 1.0 / 25;
  for (int k = 23; k >= 3; k -= 2) p = p * s2 + 1.0 / k;
  p = p * s2 + 1.0;
  return e * 0.69314718055994531 + 2.0 * s * p;
}

/// cos(2 pi u) for u in [0, 1) in plain double arithmetic: the quadrant from u exactly,
/// then the Taylor series of cos and sin on [0, pi/2) to the 20th and 21st power.
KOKKOS_INLINE_FUNCTION double random_cos_2pi(double u) {
  const double t = 4.0 * u;
  const int q = static_cast<int>(t);  // 0..3
  const double phi = (t - q) * 1.5707963267948966, x2 = phi * phi;
  const double cc[11] = {1.0,
                         -0.5,
                         0.041666666666666664,
                         -0.001388888888888889,
                         2.48015873015873e-05,
                         -2.755731922398589e-07,
                         2.08767569878681e-09,
                         -1.1470745597729725e-11,
                         4.779477332387385e-14,
                         -1.5619206968586225e-16,
                         4.110317623312165e-19};
  const double sc[11] = {1.0,
                         -0.16666666666666666,
                         0.008333333333333333,
                         -0.0001984126984126984,
                         2.7557319223985893e-06,
                         -2.505210838544172e-08,
                         1.6059043836821613e-10,
                         -7.647163731819816e-13,
                         2.8114572543455206e-15,
                         -8.22063524662433e-18,
                         1.9572941063391263e-20};
  double c = cc[10], sn = sc[10];
  for (int k = 9; k >= 0; --k) {
    c = c * x2 + cc[k];
    sn = sn * x2 + sc[k];
  }
  sn *= phi;
  // cos(q pi/2 + phi): cos, -sin, -cos, sin
  const double v = (q & 1) ? sn : c;
  return (q == 1 || q == 2) ? -v : v;
}

}  // namespace impl

/// Standard normal by Box-Muller (two 32-bit halves of the bits, cosine branch), in double
/// with kqlora's own log and cosine: the same values on every machine and backend.
KOKKOS_INLINE_FUNCTION double random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t b = random_bits(seed, stream, index);
  const double u1 = (impl::random_small_to_double(b >> 32) + 1.0) * 0x1.0p-32;    // (0, 1]
  const double u2 = impl::random_small_to_double(b & 0xffffffffull) * 0x1.0p-32;  // [0, 1)
  return sqrt(-2.0 * impl::random_log(u1)) * impl::random_cos_2pi(u2);
}

inline uint64_t layer_stream(RandomStream s, int layer) {
  return static_cast<uint64_t>(s) + static_cast<uint64_t>(layer);
}

}  // namespace kqlora
