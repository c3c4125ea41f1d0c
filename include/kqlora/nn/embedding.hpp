#pragma once
// Token embedding: x[t] = table[ids[t]], the rows of a frozen dense [vocab, features] table
// gathered for each token of [sequences, positions] ids (tokens row-major: t = s * S + p).
// The table is frozen, so there is no backward (no gradient flows into token ids). Gemma
// scales the result: x = R(x * R(s)), the scale a tensor of the activations' dtype.

#include <Kokkos_Core.hpp>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

template <class ExecSpace, class M>
void embedding_forward(const ExecSpace& exec, const Kokkos::View<const float*, M>& table,
                       const TokenMatrix<M>& ids, const Matrix<M>& x) {
  const int64_t S = ids.extent(1), F = x.extent(1);
  Kokkos::parallel_for(
      "kqlora::embedding_forward", over(exec, x.extent(0), F),
      KOKKOS_LAMBDA(int64_t t, int64_t f) { x(t, f) = table(ids(t / S, t % S) * F + f); });
}

/// The same from a table held in bfloat16 (ParamEntry::compact), widened exactly.
template <class ExecSpace, class M>
void embedding_forward(const ExecSpace& exec, const Kokkos::View<const bfloat16*, M>& table,
                       const TokenMatrix<M>& ids, const Matrix<M>& x) {
  const int64_t S = ids.extent(1), F = x.extent(1);
  Kokkos::parallel_for(
      "kqlora::embedding_forward_bf16", over(exec, x.extent(0), F),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        x(t, f) = static_cast<float>(table(ids(t / S, t % S) * F + f));
      });
}

/// x *= s, s rounded to bfloat16 first when `bf16` (then the product).
template <class ExecSpace, class M>
void embedding_scale(const ExecSpace& exec, float s, bool bf16, const Matrix<M>& x) {
  const float scale = bf16 ? round_to_bf16(s) : s;
  Kokkos::parallel_for(
      "kqlora::embedding_scale", over(exec, x.extent(0), x.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float v = x(t, f) * scale;
        x(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

}  // namespace kqlora
