#pragma once
// Synthetic tensors from the counter-based generator, as Kokkos kernels: every value a pure
// function of (seed, stream, index), so any rank, backend or thread count computes the
// same numbers for the same indices.

#include <Kokkos_Core.hpp>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/random.hpp"

namespace kqlora {

/// out(i) = normal(seed, stream, first_index + i).
template <class ExecSpace, class T, class MemSpace>
void fill_normal(const ExecSpace& exec, const Kokkos::View<T*, MemSpace>& out, uint64_t seed,
                 uint64_t stream, uint64_t first_index = 0) {
  Kokkos::parallel_for(
      "kqlora::fill_normal",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, out.extent(0)),
      KOKKOS_LAMBDA(int64_t i) {
        out(i) = T(static_cast<float>(random_normal(seed, stream, first_index + i)));
      });
}

/// Rows of global samples: m(t, f) = normal(seed, stream, (first_sample + t) * dim + f).
template <class ExecSpace, class MemSpace>
void fill_normal_rows(const ExecSpace& exec, const Matrix<MemSpace>& m, uint64_t seed,
                      uint64_t stream, int64_t first_sample) {
  const int64_t dim = m.extent(1);
  Kokkos::parallel_for(
      "kqlora::fill_normal_rows",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right>,
                            Kokkos::IndexType<int64_t>>(exec, {0, 0}, {int64_t(m.extent(0)), dim}),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        m(t, f) = static_cast<float>(
            random_normal(seed, stream, static_cast<uint64_t>((first_sample + t) * dim + f)));
      });
}

}  // namespace kqlora
