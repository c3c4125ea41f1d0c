#pragma once
// A float32 matrix of bfloat16 values kept in 16 bits, and widened back: a decoder's
// activations between its forward and its backward (nn/decoder_buffers.hpp). The narrowing
// rounds to nearest even, so it is exact on bfloat16 values and the round trip gives back
// the same floats.

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// 16-bit storage of a [tokens, width] matrix (row-major, the first tokens * width bits).
template <class M>
using Bf16Bits = Kokkos::View<uint16_t*, M>;

/// dst[0 .. x.size()) = the bfloat16 bits of x.
template <class ExecSpace, class M>
void narrow_to_bf16(const ExecSpace& exec, const Matrix<M>& x, const Bf16Bits<M>& dst) {
  const int64_t n = static_cast<int64_t>(x.size());
  const float* src = x.data();
  Kokkos::parallel_for(
      "kqlora::narrow_to_bf16",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t i) { dst(i) = bfloat16::round_bits(src[i]); });
}

/// x = the floats of src[0 .. x.size()).
template <class ExecSpace, class M>
void widen_from_bf16(const ExecSpace& exec, const Bf16Bits<M>& src, const Matrix<M>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  float* dst = x.data();
  Kokkos::parallel_for(
      "kqlora::widen_from_bf16",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t i) { dst[i] = static_cast<float>(bfloat16::from_bits(src(i))); });
}

}  // namespace kqlora
