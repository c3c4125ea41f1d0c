#pragma once
// Matrices for the kernel tests: a row-major kqlora::Matrix in a memory space from host
// values, and back.
#include <Kokkos_Core.hpp>

#include <vector>

#include "kqlora/core/blas.hpp"

namespace kqlora_test {

template <class M>
kqlora::Matrix<M> matrix(const std::vector<float>& v, int64_t rows, int64_t cols) {
  kqlora::Matrix<M> m("kqlora_test::matrix", rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) h(r, c) = v[r * cols + c];
  Kokkos::deep_copy(m, h);
  return m;
}

template <class M>
std::vector<float> host(const kqlora::Matrix<M>& m) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::vector<float> v(h.extent(0) * h.extent(1));
  for (size_t r = 0; r < h.extent(0); ++r)
    for (size_t c = 0; c < h.extent(1); ++c) v[r * h.extent(1) + c] = h(r, c);
  return v;
}

}  // namespace kqlora_test
