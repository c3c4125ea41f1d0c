#pragma once
// The residual stream: x += y (rounded to bfloat16 when `bf16`, as PyTorch adds two
// bfloat16 tensors). Its backward is the identity: the stream's gradient reaches both.

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

template <class ExecSpace, class M>
void residual_add(const ExecSpace& exec, const Matrix<M>& y, bool bf16, const Matrix<M>& x) {
  KQLORA_CHECK(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1) && y.span_is_contiguous(),
               "residual_add: shapes");
  const float* yp = y.data();
  float* xp = x.data();
  Kokkos::parallel_for(
      "kqlora::residual_add", flat_range(exec, x), KOKKOS_LAMBDA(int64_t i) {
        const float v = xp[i] + yp[i];
        xp[i] = bf16 ? round_to_bf16(v) : v;
      });
}

}  // namespace kqlora
