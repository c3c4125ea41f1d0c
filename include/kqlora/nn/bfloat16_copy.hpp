#pragma once
// float32 values that are bfloat16 values kept in 16 bits, and widened back: a decoder's
// activations between its forward and its backward (nn/decoder_buffers.hpp). The narrowing
// rounds to nearest even, so it is exact on bfloat16 values and the round trip gives back
// the same floats.

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kqlora/core/bfloat16.hpp"

namespace kqlora {

/// 16-bit storage of float32 values.
template <class M>
using Bf16Bits = Kokkos::View<uint16_t*, M>;

/// dst[0 .. n) = the bfloat16 bits of x[0 .. n).
template <class ExecSpace, class M>
void narrow_to_bf16(const ExecSpace& exec, const Kokkos::View<float*, M>& x, int64_t n,
                    const Bf16Bits<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::narrow_to_bf16",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t i) { dst(i) = bfloat16::round_bits(x(i)); });
}

/// x[0 .. n) = the floats of src[0 .. n).
template <class ExecSpace, class M>
void widen_from_bf16(const ExecSpace& exec, const Bf16Bits<M>& src, int64_t n,
                     const Kokkos::View<float*, M>& x) {
  Kokkos::parallel_for(
      "kqlora::widen_from_bf16",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t i) { x(i) = static_cast<float>(bfloat16::from_bits(src(i))); });
}

}  // namespace kqlora
