#pragma once
// Gemma 4's per-layer inputs (docs/MODELS.md, "Gemma 4"): a [T, L * P] matrix made once
// a pass from the tokens and the scaled embeddings,
//   ple = (norm(x0 W^T * hidden^-1/2) + E_ple[ids] * sqrt(P)) * 2^-1/2    (ple_combine)
// of which layer l reads columns [l P, (l + 1) P): its block output h feeds
//   a = act(h G^T) * ple_l,  h' = h + norm(a R^T)                         (ple_gate_*)
// Every product rounded to bfloat16 in a bfloat16 run, as transformers' tensors are. The
// per-layer inputs come from frozen tensors only: no gradient flows into them.

#include <Kokkos_Core.hpp>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// ple = ((proj + tok) rounded) * 2^-1/2 rounded, in place over tok.
template <class ExecSpace, class M>
void ple_combine(const ExecSpace& exec, bool bf16, const Matrix<M>& proj, const Matrix<M>& tok) {
  const float* pp = proj.data();
  float* tp = tok.data();
  const float scale = 0.70710678118654752f;  // (2.0 ** -0.5, a Python float)
  Kokkos::parallel_for(
      "kqlora::ple_combine", flat_range(exec, tok), KOKKOS_LAMBDA(int64_t i) {
        const float s = bf16 ? round_to_bf16(pp[i] + tp[i]) : pp[i] + tp[i];
        tp[i] = bf16 ? round_to_bf16(s * scale) : s * scale;
      });
}

/// out = act(gate) * ple[:, col0 : col0 + P] (the activation rounded, then the product).
template <class ExecSpace, class M>
void ple_gate_forward(const ExecSpace& exec, Activation act, bool bf16, const Matrix<M>& gate,
                      const Matrix<M>& ple, int64_t col0, const Matrix<M>& out) {
  Kokkos::parallel_for(
      "kqlora::ple_gate_forward", over(exec, gate.extent(0), gate.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float a = activation_value(act, gate(t, f));
        if (bf16) a = round_to_bf16(a);
        const float v = a * ple(t, col0 + f);
        out(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

/// g (the product's gradient) becomes the gate's in place: g * ple_l (rounded), times
/// act'(gate) (rounded).
template <class ExecSpace, class M>
void ple_gate_backward(const ExecSpace& exec, Activation act, bool bf16, const Matrix<M>& gate,
                       const Matrix<M>& ple, int64_t col0, const Matrix<M>& g) {
  Kokkos::parallel_for(
      "kqlora::ple_gate_backward", over(exec, gate.extent(0), gate.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float v = g(t, f) * ple(t, col0 + f);
        if (bf16) v = round_to_bf16(v);
        v *= activation_derivative(act, gate(t, f));
        g(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

}  // namespace kqlora
