#pragma once
// The gated MLP's product: a = act(g) * u over [tokens, intermediate], with act SiLU
// (Llama's SwiGLU) or tanh-GELU (Gemma's GeGLU) -- PyTorch's act_fn(gate_proj(x)) *
// up_proj(x): in bfloat16, the activation's output is rounded, then the product. The
// backward gives both input gradients:
//   gg = ga * u * act'(g),   gu = ga * act(g).

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

namespace impl {

// The kernels with the activation a compile-time constant: its switch folds away and the
// loop stays a straight pass (a runtime switch per element cost the 135M step 5-10%). A
// team per token row, the bfloat16 choice outside the loop: the host's loop over a row then
// vectorises (row_loops.hpp); as a 2-D range it stayed scalar (12 ns an element).
template <Activation A, bool BF16>
KOKKOS_FORCEINLINE_FUNCTION float gated_value(float z, float u) {
  float s = activation_value(A, z);
  if (BF16) s = round_to_bf16(s);
  const float v = s * u;
  return BF16 ? round_to_bf16(v) : v;
}

template <Activation A, bool BF16, class ExecSpace, class M>
void gated_mlp_forward(const ExecSpace& exec, const Matrix<M>& g, const Matrix<M>& u,
                       const Matrix<M>& a) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t F = a.extent(1);
  Kokkos::parallel_for(
      "kqlora::gated_mlp_forward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(a.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t t = team.league_rank();
        row_for(team, 0, F, [&](int64_t f) { a(t, f) = gated_value<A, BF16>(g(t, f), u(t, f)); });
      });
}

/// One element's gradients: gg = d u act'(z), gu = d act(z).
template <Activation A, bool BF16>
KOKKOS_FORCEINLINE_FUNCTION void gated_gradients(float z, float u, float d, float& gg, float& gu) {
  float s = activation_value(A, z);
  if (BF16) s = round_to_bf16(s);
  float vg = d * u * activation_derivative(A, z), vu = d * s;
  if (BF16) {
    vg = round_to_bf16(vg);
    vu = round_to_bf16(vu);
  }
  gg = vg;
  gu = vu;
}

template <Activation A, bool BF16, class ExecSpace, class M>
void gated_mlp_backward(const ExecSpace& exec, const Matrix<M>& g, const Matrix<M>& u,
                        const Matrix<M>& ga, const Matrix<M>& gg, const Matrix<M>& gu) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t F = ga.extent(1);
  Kokkos::parallel_for(
      "kqlora::gated_mlp_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(ga.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t t = team.league_rank();
        if (team.team_size() == 1) {
          // A plain loop over the row: through row_for, GCC 12 kept the bfloat16 body a call
          // per element (too large to inline), scalar (10x slower than the float32 pass).
          const float *zr = &g(t, 0), *ur = &u(t, 0), *dr = &ga(t, 0);
          float *ggr = &gg(t, 0), *gur = &gu(t, 0);
          for (int64_t f = 0; f < F; ++f)
            gated_gradients<A, BF16>(zr[f], ur[f], dr[f], ggr[f], gur[f]);
          return;
        }
        row_for(team, 0, F, [&](int64_t f) {
          gated_gradients<A, BF16>(g(t, f), u(t, f), ga(t, f), gg(t, f), gu(t, f));
        });
      });
}

}  // namespace impl

/// act: silu or gelu_tanh.
template <class ExecSpace, class M>
void gated_mlp_forward(const ExecSpace& exec, Activation act, const Matrix<M>& g,
                       const Matrix<M>& u, bool bf16, const Matrix<M>& a) {
  if (act == Activation::gelu_tanh) {
    if (bf16)
      impl::gated_mlp_forward<Activation::gelu_tanh, true>(exec, g, u, a);
    else
      impl::gated_mlp_forward<Activation::gelu_tanh, false>(exec, g, u, a);
  } else if (bf16) {
    impl::gated_mlp_forward<Activation::silu, true>(exec, g, u, a);
  } else {
    impl::gated_mlp_forward<Activation::silu, false>(exec, g, u, a);
  }
}

/// From the forward's g and u and the output gradient ga: gg and gu (either may alias ga).
template <class ExecSpace, class M>
void gated_mlp_backward(const ExecSpace& exec, Activation act, const Matrix<M>& g,
                        const Matrix<M>& u, const Matrix<M>& ga, bool bf16, const Matrix<M>& gg,
                        const Matrix<M>& gu) {
  if (act == Activation::gelu_tanh) {
    if (bf16)
      impl::gated_mlp_backward<Activation::gelu_tanh, true>(exec, g, u, ga, gg, gu);
    else
      impl::gated_mlp_backward<Activation::gelu_tanh, false>(exec, g, u, ga, gg, gu);
  } else if (bf16) {
    impl::gated_mlp_backward<Activation::silu, true>(exec, g, u, ga, gg, gu);
  } else {
    impl::gated_mlp_backward<Activation::silu, false>(exec, g, u, ga, gg, gu);
  }
}

}  // namespace kqlora
