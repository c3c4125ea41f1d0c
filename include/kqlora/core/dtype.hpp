#pragma once
// The element types kqlora computes in, and the arithmetic that rounds to them.

#include <Kokkos_Macros.hpp>

#include <string>

#include "kqlora/core/bfloat16.hpp"

namespace kqlora {

enum class DType { float32, bfloat16 };

const char* dtype_name(DType t);
/// Parses "float32" or "bfloat16"; throws InputError naming `what` otherwise.
DType parse_dtype(const std::string& s, const std::string& what);
inline int dtype_size(DType t) {
  return t == DType::float32 ? 4 : 2;
}

/// Arithmetic "in the dtype": a float32 result rounded once to the dtype and held as float.
template <class T>
struct Rounding;

template <>
struct Rounding<float> {
  static constexpr DType dtype = DType::float32;
  KOKKOS_INLINE_FUNCTION static float round(float x) { return x; }
  KOKKOS_INLINE_FUNCTION static float load(float x) { return x; }
  KOKKOS_INLINE_FUNCTION static float store(float x) { return x; }
};

template <>
struct Rounding<bfloat16> {
  static constexpr DType dtype = DType::bfloat16;
  KOKKOS_INLINE_FUNCTION static float round(float x) { return round_to_bf16(x); }
  KOKKOS_INLINE_FUNCTION static float load(bfloat16 x) { return static_cast<float>(x); }
  KOKKOS_INLINE_FUNCTION static bfloat16 store(float x) { return bfloat16(x); }
};

}  // namespace kqlora
