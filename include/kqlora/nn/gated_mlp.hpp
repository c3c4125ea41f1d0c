#pragma once
// The gated MLP's product: a = act(g) * u over [tokens, intermediate], with act SiLU
// (Llama's SwiGLU) or tanh-GELU (Gemma's GeGLU) -- PyTorch's act_fn(gate_proj(x)) *
// up_proj(x): in bfloat16, the activation's output is rounded, then the product. The
// backward gives both input gradients:
//   gg = ga * u * act'(g),   gu = ga * act(g).

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

namespace impl {

// The kernels with the activation a compile-time constant: its switch folds away and the
// loop stays a straight pass (a runtime switch per element cost the 135M step 5-10%).
template <Activation A, class ExecSpace, class M>
void gated_mlp_forward(const ExecSpace& exec, const Matrix<M>& g, const Matrix<M>& u, bool bf16,
                       const Matrix<M>& a) {
  Kokkos::parallel_for(
      "kqlora::gated_mlp_forward", over(exec, a.extent(0), a.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float s = activation_value(A, g(t, f));
        if (bf16) s = round_to_bf16(s);
        const float v = s * u(t, f);
        a(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

template <Activation A, class ExecSpace, class M>
void gated_mlp_backward(const ExecSpace& exec, const Matrix<M>& g, const Matrix<M>& u,
                        const Matrix<M>& ga, bool bf16, const Matrix<M>& gg, const Matrix<M>& gu) {
  Kokkos::parallel_for(
      "kqlora::gated_mlp_backward", over(exec, ga.extent(0), ga.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float z = g(t, f), d = ga(t, f);
        float s = activation_value(A, z);
        if (bf16) s = round_to_bf16(s);
        float vg = d * u(t, f) * activation_derivative(A, z), vu = d * s;
        if (bf16) {
          vg = round_to_bf16(vg);
          vu = round_to_bf16(vu);
        }
        gg(t, f) = vg;
        gu(t, f) = vu;
      });
}

}  // namespace impl

/// act: silu or gelu_tanh.
template <class ExecSpace, class M>
void gated_mlp_forward(const ExecSpace& exec, Activation act, const Matrix<M>& g,
                       const Matrix<M>& u, bool bf16, const Matrix<M>& a) {
  if (act == Activation::gelu_tanh) {
    impl::gated_mlp_forward<Activation::gelu_tanh>(exec, g, u, bf16, a);
  } else {
    impl::gated_mlp_forward<Activation::silu>(exec, g, u, bf16, a);
  }
}

/// From the forward's g and u and the output gradient ga: gg and gu (either may alias ga).
template <class ExecSpace, class M>
void gated_mlp_backward(const ExecSpace& exec, Activation act, const Matrix<M>& g,
                        const Matrix<M>& u, const Matrix<M>& ga, bool bf16, const Matrix<M>& gg,
                        const Matrix<M>& gu) {
  if (act == Activation::gelu_tanh) {
    impl::gated_mlp_backward<Activation::gelu_tanh>(exec, g, u, ga, bf16, gg, gu);
  } else {
    impl::gated_mlp_backward<Activation::silu>(exec, g, u, ga, bf16, gg, gu);
  }
}

}  // namespace kqlora
