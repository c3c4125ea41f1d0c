#pragma once
// The residual stream: x += y, or out = x + y in one pass (rounded to bfloat16 when `bf16`,
// as PyTorch adds two bfloat16 tensors). Its backward is the identity: the stream's
// gradient reaches both.

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

/// out = x + y (a copy of x and residual_add in one pass: the same sums).
template <class ExecSpace, class M>
void residual_sum(const ExecSpace& exec, const Matrix<M>& x, const Matrix<M>& y, bool bf16,
                  const Matrix<M>& out) {
  KQLORA_CHECK(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1) &&
                   out.extent(0) == x.extent(0) && out.extent(1) == x.extent(1) &&
                   x.span_is_contiguous() && y.span_is_contiguous() && out.span_is_contiguous(),
               "residual_sum: shapes");
  const float *xp = x.data(), *yp = y.data();
  float* op = out.data();
  Kokkos::parallel_for(
      "kqlora::residual_sum", flat_range(exec, out), KOKKOS_LAMBDA(int64_t i) {
        const float v = xp[i] + yp[i];
        op[i] = bf16 ? round_to_bf16(v) : v;
      });
}

}  // namespace kqlora
