#pragma once
// A shared expert's gate (Qwen2-MoE; docs/MODELS.md, "Experts"): the shared expert's output
// s, scaled per token by sigmoid(x g^T) with g a frozen [1, hidden] linear, added to the
// routed experts' y -- transformers' y + sigmoid(shared_expert_gate(x)) * s, each op
// rounded in bfloat16. The backward gives the shared expert's output gradient and adds the
// gate's path into the input's gradient (g itself is frozen).

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// y += sigmoid(x g^T) * s per token; the sigmoids into sig [T].
template <class ExecSpace, class M>
void shared_expert_gate_forward(const ExecSpace& exec, const Matrix<M>& x,
                                const Kokkos::View<const float*, M>& g, const Matrix<M>& s,
                                bool bf16, const Kokkos::View<float*, M>& sig, const Matrix<M>& y) {
  const int64_t H = x.extent(1);
  KQLORA_CHECK(s.extent(0) == x.extent(0) && y.extent(0) == x.extent(0) && s.extent(1) == H &&
                   y.extent(1) == H && static_cast<int64_t>(g.extent(0)) == H,
               "shared_expert_gate_forward: shapes");
  Kokkos::parallel_for(
      "kqlora::shared_expert_gate_forward",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        float logit = 0;
        for (int64_t h = 0; h < H; ++h) logit += x(t, h) * g(h);
        if (bf16) logit = round_to_bf16(logit);
        float p = 1.0f / (1.0f + expf(-logit));
        if (bf16) p = round_to_bf16(p);
        sig(t) = p;
        for (int64_t h = 0; h < H; ++h) {
          const float v = bf16 ? round_to_bf16(p * s(t, h)) : p * s(t, h);
          y(t, h) = bf16 ? round_to_bf16(y(t, h) + v) : y(t, h) + v;
        }
      });
}

/// gs = sigmoid * gy (the shared expert's output gradient), and gx += dlogit g with
/// dlogit = (gy . s) sigmoid (1 - sigmoid) per token.
template <class ExecSpace, class M>
void shared_expert_gate_backward(const ExecSpace& exec, const Matrix<M>& gy,
                                 const Kokkos::View<const float*, M>& g, const Matrix<M>& s,
                                 const Kokkos::View<const float*, M>& sig, bool bf16,
                                 const Matrix<M>& gs, const Matrix<M>& gx) {
  const int64_t H = gy.extent(1);
  KQLORA_CHECK(s.extent(1) == H && gs.extent(1) == H && gx.extent(1) == H &&
                   static_cast<int64_t>(g.extent(0)) == H,
               "shared_expert_gate_backward: shapes");
  Kokkos::parallel_for(
      "kqlora::shared_expert_gate_backward",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, gy.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        const float p = sig(t);
        float dsig = 0;
        for (int64_t h = 0; h < H; ++h) {
          dsig += gy(t, h) * s(t, h);
          gs(t, h) = bf16 ? round_to_bf16(p * gy(t, h)) : p * gy(t, h);
        }
        if (bf16) dsig = round_to_bf16(dsig);
        float dlogit = dsig * p * (1.0f - p);
        if (bf16) dlogit = round_to_bf16(dlogit);
        for (int64_t h = 0; h < H; ++h) {
          const float v = dlogit * g(h);
          gx(t, h) = bf16 ? round_to_bf16(gx(t, h) + round_to_bf16(v)) : gx(t, h) + v;
        }
      });
}

}  // namespace kqlora
