#pragma once
// Gemma 4's router input (transformers' Gemma4TextRouter): r = n * s * c, n the residual
// x's RMSNorm without a weight (float32, rounded once), s a frozen [hidden] scale, c =
// hidden^-1/2 (a Python float); each product rounded in a bfloat16 run. The router's
// logits are r R^T (docs/MODELS.md, "Gemma 4"). The backward adds x's gradient from r's.

#include <Kokkos_Core.hpp>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/rms_norm.hpp"

namespace kqlora {

/// r = R(R(unitnorm(x)) * s) * c rounded; inv [T] receives each row's 1/rms.
template <class ExecSpace, class M>
void router_input_forward(const ExecSpace& exec, const Matrix<M>& x,
                          const Kokkos::View<const float*, M>& s, float c, float eps, bool bf16,
                          const Matrix<M>& r, const Kokkos::View<float*, M>& inv) {
  rms_norm_forward(exec, x, Kokkos::View<const float*, M>(), eps, bf16, r, inv, NormKind::unit);
  Kokkos::parallel_for(
      "kqlora::router_input_forward", over(exec, r.extent(0), r.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float v = r(t, f) * s(f);
        if (bf16) v = round_to_bf16(v);
        v *= c;
        r(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

/// gx += d r / dx . gr (gr is overwritten: the norm output's gradient on the way).
template <class ExecSpace, class M>
void router_input_backward(const ExecSpace& exec, const Matrix<M>& x,
                           const Kokkos::View<const float*, M>& s, float c,
                           const Kokkos::View<const float*, M>& inv, bool bf16, const Matrix<M>& gr,
                           const Matrix<M>& gx) {
  Kokkos::parallel_for(
      "kqlora::router_input_backward", over(exec, gr.extent(0), gr.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float v = gr(t, f) * c;
        if (bf16) v = round_to_bf16(v);
        v *= s(f);
        gr(t, f) = bf16 ? round_to_bf16(v) : v;
      });
  rms_norm_backward(exec, x, Kokkos::View<const float*, M>(), inv, gr, gx, NormKind::unit,
                    NormGradOut::add, bf16);
}

}  // namespace kqlora
