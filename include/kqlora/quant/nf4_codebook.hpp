#pragma once
// The 16 NF4 values and the element-level rules of quantization and dequantization,
// shared by every kernel (host SIMD paths must agree with these bit for bit).

#include <Kokkos_Macros.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/core/dtype.hpp"

namespace kqlora {

/// The codebook literals (torchao's; docs/NF4.md), as float32.
KOKKOS_INLINE_FUNCTION float nf4_literal(int code) {
  switch (code) {
    case 0:
      return -1.0f;
    case 1:
      return -0.6962f;
    case 2:
      return -0.5251f;
    case 3:
      return -0.3949f;
    case 4:
      return -0.2844f;
    case 5:
      return -0.1848f;
    case 6:
      return -0.0911f;
    case 7:
      return 0.0f;
    case 8:
      return 0.0796f;
    case 9:
      return 0.1609f;
    case 10:
      return 0.2461f;
    case 11:
      return 0.3379f;
    case 12:
      return 0.4407f;
    case 13:
      return 0.5626f;
    case 14:
      return 0.7230f;
    default:
      return 1.0f;
  }
}

/// The code for an all-zero block (its scaled values are NaN): 0.0.
constexpr int nf4_zero_code = 7;

/// Codebook value `code` rounded to the dtype T.
template <class T>
KOKKOS_INLINE_FUNCTION float nf4_value(int code) {
  return Rounding<T>::round(nf4_literal(code));
}

/// The codebook rounded to the dtype T, held by value in kernels (on CUDA it travels with
/// the kernel's arguments; on CPUs its loads are hoisted out of the element loops).
struct Nf4Codebook {
  float v[16];

  template <class T>
  static Nf4Codebook make() {
    Nf4Codebook c;
    for (int k = 0; k < 16; ++k) c.v[k] = nf4_value<T>(k);
    return c;
  }
};

/// Index of the codebook value nearest to `scaled` (= x/absmax rounded to T), with the
/// distances rounded to T and ties to the lower index, as torchao's argmin. Rounding is
/// monotone, so the winner is one of the two codebook values around `scaled`: only those
/// two distances are computed.
template <class T>
KOKKOS_INLINE_FUNCTION int nf4_nearest_code(float scaled, const Nf4Codebook& cb) {
  int lo = 0;  // largest index <= 14 with value <= scaled
  for (int k = 1; k < 15; ++k) lo += (scaled >= cb.v[k]) ? 1 : 0;
  const float d_lo = Rounding<T>::round(fabsf(scaled - cb.v[lo]));
  const float d_hi = Rounding<T>::round(fabsf(scaled - cb.v[lo + 1]));
  const int code = d_hi < d_lo ? lo + 1 : lo;
  return scaled == scaled ? code : nf4_zero_code;  // NaN: 0/0 of an all-zero block
}

/// Block scaler from its int8 and its scaler block's factor: q / factor + mean, each
/// operation rounded to T.
template <class T>
KOKKOS_INLINE_FUNCTION float nf4_block_scale(int8_t q, float factor, float mean) {
  return Rounding<T>::round(Rounding<T>::round(static_cast<float>(q) / factor) + mean);
}

/// Dequantized value of a codebook value (already in T) in a block with scale `scale`,
/// rounded to T.
template <class T>
KOKKOS_INLINE_FUNCTION float nf4_decode(float codebook_value, float scale) {
  return Rounding<T>::round(codebook_value * scale);
}

}  // namespace kqlora
