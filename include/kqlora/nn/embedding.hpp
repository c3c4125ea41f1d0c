#pragma once
// Token embedding: x[t] = table[ids[t]], the rows of a frozen dense [vocab, features] table
// gathered for each token of [sequences, positions] ids (tokens row-major: t = s * S + p).
// The table is frozen, so there is no backward (no gradient flows into token ids).

#include <Kokkos_Core.hpp>

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

}  // namespace kqlora
