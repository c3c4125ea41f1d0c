#pragma once
// The counter-based random generator of DESIGN.md: every value is a pure function of
// (seed, stream, index), so any rank computes any value on its own and a step's global
// batch is the same whatever the world size. The mixing is SplitMix64's finaliser applied
// twice with the key folded in between (statistically sound for initialisation and
// synthetic data; not for cryptography).

#include <Kokkos_Macros.hpp>

#include <cmath>
#include <cstdint>

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

/// Standard normal (Box-Muller on two 32-bit halves, cosine branch), computed in double.
inline double random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t b = random_bits(seed, stream, index);
  const double u1 = (static_cast<double>(b >> 32) + 1.0) * 0x1.0p-32;    // (0, 1]
  const double u2 = static_cast<double>(b & 0xffffffffull) * 0x1.0p-32;  // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

inline uint64_t layer_stream(RandomStream s, int layer) {
  return static_cast<uint64_t>(s) + static_cast<uint64_t>(layer);
}

}  // namespace kqlora
