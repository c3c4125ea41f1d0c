#pragma once
// gpt-oss's expert activation (GptOssExperts._apply_gate), over [rows, intermediate] gate
// and up values:
//   g = min(gate, limit),  u = clamp(up, -limit, limit),
//   a = g * sigmoid(alpha * g) * (u + 1)
// in bfloat16 each of PyTorch's operations rounded (alpha g, the sigmoid, g s, u + 1, the
// product). The backward passes a gradient only where the clamps did not bind (PyTorch's
// clamp: at the bound it passes):
//   gg = ga (u + 1) (s + alpha g s (1 - s)) where gate <= limit, else 0
//   gu = ga g s                              where |up| <= limit, else 0.

#include <Kokkos_Core.hpp>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

struct ClampedSwiglu {
  float alpha = 1.702f, limit = 7.0f;
};

namespace impl {

/// The clamped values and the sigmoid of one element (rounded as the forward when `bf16`).
KOKKOS_FORCEINLINE_FUNCTION void clamped_swiglu_parts(const ClampedSwiglu& c, bool bf16, float gate,
                                                      float up, float& g, float& u, float& s) {
  g = gate < c.limit ? gate : c.limit;
  u = up < -c.limit ? -c.limit : (up > c.limit ? c.limit : up);
  float z = c.alpha * g;
  if (bf16) z = round_to_bf16(z);
  s = 1.0f / (1.0f + fast_exp(-z));
  if (bf16) s = round_to_bf16(s);
}

}  // namespace impl

/// a = the clamped SwiGLU of gate and up (see the header).
template <class ExecSpace, class M>
void clamped_swiglu_forward(const ExecSpace& exec, const ClampedSwiglu& c, const Matrix<M>& gate,
                            const Matrix<M>& up, bool bf16, const Matrix<M>& a) {
  Kokkos::parallel_for(
      "kqlora::clamped_swiglu_forward", over(exec, a.extent(0), a.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float g, u, s;
        impl::clamped_swiglu_parts(c, bf16, gate(t, f), up(t, f), g, u, s);
        if (!bf16) {
          a(t, f) = g * s * (u + 1.0f);
          return;
        }
        const float glu = round_to_bf16(g * s), u1 = round_to_bf16(u + 1.0f);
        a(t, f) = round_to_bf16(u1 * glu);
      });
}

/// From the forward's gate and up and the output gradient ga: gg and gu (either may alias
/// ga).
template <class ExecSpace, class M>
void clamped_swiglu_backward(const ExecSpace& exec, const ClampedSwiglu& c, const Matrix<M>& gate,
                             const Matrix<M>& up, const Matrix<M>& ga, bool bf16,
                             const Matrix<M>& gg, const Matrix<M>& gu) {
  Kokkos::parallel_for(
      "kqlora::clamped_swiglu_backward", over(exec, ga.extent(0), ga.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float x = gate(t, f), y = up(t, f), d = ga(t, f);
        float g, u, s;
        impl::clamped_swiglu_parts(c, bf16, x, y, g, u, s);
        float glu = g * s, u1 = u + 1.0f;
        if (bf16) {
          glu = round_to_bf16(glu);
          u1 = round_to_bf16(u1);
        }
        float vg = x <= c.limit ? d * u1 * (s + c.alpha * g * s * (1.0f - s)) : 0.0f;
        float vu = y >= -c.limit && y <= c.limit ? d * glu : 0.0f;
        if (bf16) {
          vg = round_to_bf16(vg);
          vu = round_to_bf16(vu);
        }
        gg(t, f) = vg;
        gu(t, f) = vu;
      });
}

}  // namespace kqlora
