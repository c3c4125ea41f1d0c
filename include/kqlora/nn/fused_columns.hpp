#pragma once
// A fused projection's output split into its slots, and their gradients gathered back:
// columns [col0, col0 + dst.extent(1)) of a [tokens, fused] matrix (Phi-3's qkv_proj =
// [q | k | v], gate_up_proj = [gate | up]).

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// dst = src[:, col0 : col0 + width].
template <class ExecSpace, class M>
void take_columns(const ExecSpace& exec, const Matrix<M>& src, int64_t col0, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::take_columns", over(exec, dst.extent(0), dst.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) { dst(t, f) = src(t, col0 + f); });
}

/// dst[:, col0 : col0 + width] = src.
template <class ExecSpace, class M>
void put_columns(const ExecSpace& exec, const Matrix<M>& src, int64_t col0, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::put_columns", over(exec, src.extent(0), src.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) { dst(t, col0 + f) = src(t, f); });
}

}  // namespace kqlora
