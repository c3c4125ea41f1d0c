#pragma once
// Clamping activations to [-c, c] (OLMoE's clip_qkv, as torch.clamp_): the forward, and the
// backward that passes a gradient where the clamp's input was within
// [-c, c] (ends included, as torch) and zeroes it elsewhere.

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// y = min(max(x, -c), c) (y may be x; rounded to bfloat16 when `bf16`: the bound is).
template <class ExecSpace, class M>
void clip_forward(const ExecSpace& exec, float c, bool bf16, const Matrix<M>& x,
                  const Matrix<M>& y) {
  KQLORA_CHECK(x.extent(0) == y.extent(0) && x.extent(1) == y.extent(1) && x.span_is_contiguous() &&
                   y.span_is_contiguous(),
               "clip_forward: shapes");
  const float hi = bf16 ? round_to_bf16(c) : c;
  const float* xp = x.data();
  float* yp = y.data();
  Kokkos::parallel_for(
      "kqlora::clip_forward", flat_range(exec, y), KOKKOS_LAMBDA(int64_t i) {
        const float v = xp[i];
        yp[i] = v > hi ? hi : (v < -hi ? -hi : v);
      });
}

/// g = g where -c <= x <= c, else 0; x the clamp's input (the same shape as g).
template <class ExecSpace, class M>
void clip_backward(const ExecSpace& exec, float c, bool bf16, const Matrix<M>& x,
                   const Matrix<M>& g) {
  KQLORA_CHECK(x.extent(0) == g.extent(0) && x.extent(1) == g.extent(1) && x.span_is_contiguous() &&
                   g.span_is_contiguous(),
               "clip_backward: shapes");
  const float hi = bf16 ? round_to_bf16(c) : c;
  const float* xp = x.data();
  float* gp = g.data();
  Kokkos::parallel_for(
      "kqlora::clip_backward", flat_range(exec, g), KOKKOS_LAMBDA(int64_t i) {
        if (!(xp[i] >= -hi && xp[i] <= hi)) gp[i] = 0.0f;
      });
}

}  // namespace kqlora
