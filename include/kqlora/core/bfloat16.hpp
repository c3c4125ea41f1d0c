#pragma once
// bfloat16 of our own: the top 16 bits of an IEEE float32. Conversion from float rounds to
// nearest even and keeps NaN a (quiet) NaN; arithmetic is done by the caller in float32
// and rounded once, which is what PyTorch does for bfloat16 tensors.

#include <Kokkos_Macros.hpp>

#include <cstdint>

#include "kqlora/core/bit_cast.hpp"

namespace kqlora {

struct bfloat16 {
  uint16_t bits = 0;

  KOKKOS_DEFAULTED_FUNCTION bfloat16() = default;
  KOKKOS_INLINE_FUNCTION explicit bfloat16(float f) : bits(round_bits(f)) {}

  KOKKOS_INLINE_FUNCTION static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    return bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  }

  /// Round-to-nearest-even of a float32's bits to bfloat16's 16 bits.
  KOKKOS_INLINE_FUNCTION static uint16_t round_bits(float f) {
    const uint32_t u = bit_cast<uint32_t>(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;  // keeps sign and payload top
    // A select, not a branch: loops over bfloat16 data stay vectorisable.
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

/// Rounds a float32 value to the nearest bfloat16 and widens it back: the value a
/// bfloat16 operation computed in float32 leaves behind.
KOKKOS_INLINE_FUNCTION float round_to_bf16(float f) {
  return static_cast<float>(bfloat16(f));
}

/// Correctly rounded (nearest even) double -> bfloat16, without the double rounding of
/// double -> float -> bfloat16.
bfloat16 bf16_from_double(double v);

}  // namespace kqlora
