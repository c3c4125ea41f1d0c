#pragma once
// The residual stream: x += y (rounded to bfloat16 when `bf16`, as PyTorch adds two
// bfloat16 tensors). Its backward is the identity: the stream's gradient reaches both.

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

template <class ExecSpace, class M>
void residual_add(const ExecSpace& exec, const Matrix<M>& y, bool bf16, const Matrix<M>& x) {
  Kokkos::parallel_for(
      "kqlora::residual_add", over(exec, x.extent(0), x.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float v = x(t, f) + y(t, f);
        x(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

}  // namespace kqlora
