#pragma once
// Qwen3.5's gated attention (docs/MODELS.md, "The families"): q_proj writes [q_h | gate_h]
// per head, split here into q and the gates; the attention output a is multiplied by
// sigmoid(gate) before o_proj (each rounded in a bfloat16 run: the sigmoid, then the
// product), and the backward gives d a = g s and d gate = g a s (1 - s), joined back into
// q_proj's [q | gate] layout with q's gradient.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

namespace impl {

KOKKOS_INLINE_FUNCTION float gate_sigmoid(float gate, bool bf16) {
  const float s = 1.0f / (1.0f + expf(-gate));
  return bf16 ? round_to_bf16(s) : s;
}

}  // namespace impl

/// full [T, heads * 2d] ([q_h | gate_h] per head) into q and gate [T, heads * d].
template <class ExecSpace, class M>
void split_gated_q(const ExecSpace& exec, const Matrix<M>& full, int64_t d, const Matrix<M>& q,
                   const Matrix<M>& gate) {
  Kokkos::parallel_for(
      "kqlora::split_gated_q", over(exec, q.extent(0), q.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t x) {
        const int64_t h = x / d, j = x % d;
        q(t, x) = full(t, h * 2 * d + j);
        gate(t, x) = full(t, h * 2 * d + d + j);
      });
}

/// The inverse: gq and ggate [T, heads * d] into full [T, heads * 2d].
template <class ExecSpace, class M>
void join_gated_q(const ExecSpace& exec, const Matrix<M>& gq, const Matrix<M>& ggate, int64_t d,
                  const Matrix<M>& full) {
  Kokkos::parallel_for(
      "kqlora::join_gated_q", over(exec, gq.extent(0), gq.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t x) {
        const int64_t h = x / d, j = x % d;
        full(t, h * 2 * d + j) = gq(t, x);
        full(t, h * 2 * d + d + j) = ggate(t, x);
      });
}

/// out = att * sigmoid(gate).
template <class ExecSpace, class M>
void attention_gate_forward(const ExecSpace& exec, const Matrix<M>& att, const Matrix<M>& gate,
                            bool bf16, const Matrix<M>& out) {
  const float *a = att.data(), *g = gate.data();
  float* o = out.data();
  Kokkos::parallel_for(
      "kqlora::attention_gate_forward", flat_range(exec, out), KOKKOS_LAMBDA(int64_t i) {
        const float v = a[i] * impl::gate_sigmoid(g[i], bf16);
        o[i] = bf16 ? round_to_bf16(v) : v;
      });
}

/// From g (the gradient of out, overwritten with that of att), ggate: the gate's.
template <class ExecSpace, class M>
void attention_gate_backward(const ExecSpace& exec, const Matrix<M>& att, const Matrix<M>& gate,
                             bool bf16, const Matrix<M>& g, const Matrix<M>& ggate) {
  const float *a = att.data(), *gt = gate.data();
  float *gp = g.data(), *gg = ggate.data();
  Kokkos::parallel_for(
      "kqlora::attention_gate_backward", flat_range(exec, g), KOKKOS_LAMBDA(int64_t i) {
        const float s = impl::gate_sigmoid(gt[i], bf16), gi = gp[i];
        float ds = gi * a[i];
        if (bf16) ds = round_to_bf16(ds);
        const float dg = ds * s * (1.0f - s), da = gi * s;
        gg[i] = bf16 ? round_to_bf16(dg) : dg;
        gp[i] = bf16 ? round_to_bf16(da) : da;
      });
}

}  // namespace kqlora
