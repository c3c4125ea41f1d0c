#pragma once
// Gated DeltaNet's output norm (transformers' Qwen3_5RMSNormGated; docs/MODELS.md, "Gated
// DeltaNet"): per head of width d (x and z [tokens, heads * d], the weight w [d]),
//   n = x rsqrt(mean(x^2) + eps)          (float32)
//   y = (w * n) * silu(z)                 (float32)
// and in a bfloat16 run in transformers' cast order: n rounded, w * n rounded (two bfloat16
// tensors), times silu(z) computed in float32, rounded once. The backward rounds each
// intermediate gradient likewise; `inv` keeps each (token, head)'s rsqrt.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

namespace impl {

KOKKOS_INLINE_FUNCTION float rounded_if(bool bf16, float v) {
  return bf16 ? round_to_bf16(v) : v;
}

}  // namespace impl

template <class ExecSpace, class M>
void gated_rms_norm_forward(const ExecSpace& exec, const Matrix<M>& x, const Matrix<M>& z,
                            const Kokkos::View<const float*, M>& w, int64_t d, float eps, bool bf16,
                            const Matrix<M>& y, const Kokkos::View<float*, M>& inv) {
  const int64_t heads = x.extent(1) / d;
  Kokkos::parallel_for(
      "kqlora::gated_rms_norm_forward", over(exec, x.extent(0), heads),
      KOKKOS_LAMBDA(int64_t t, int64_t h) {
        const int64_t c0 = h * d;
        float ss = 0.0f;
        for (int64_t j = 0; j < d; ++j) ss += x(t, c0 + j) * x(t, c0 + j);
        const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
        inv(t * heads + h) = r;
        for (int64_t j = 0; j < d; ++j) {
          float n = x(t, c0 + j) * r, p;
          if (bf16) n = round_to_bf16(n);
          p = w(j) * n;
          if (bf16) p = round_to_bf16(p);
          const float v = p * activation_value(Activation::silu, z(t, c0 + j));
          y(t, c0 + j) = bf16 ? round_to_bf16(v) : v;
        }
      });
}

/// gx and gz from gy (neither may alias x, z or gy).
template <class ExecSpace, class M>
void gated_rms_norm_backward(const ExecSpace& exec, const Matrix<M>& x, const Matrix<M>& z,
                             const Kokkos::View<const float*, M>& w, int64_t d, bool bf16,
                             const Kokkos::View<const float*, M>& inv, const Matrix<M>& gy,
                             const Matrix<M>& gx, const Matrix<M>& gz) {
  const int64_t heads = x.extent(1) / d;
  Kokkos::parallel_for(
      "kqlora::gated_rms_norm_backward", over(exec, x.extent(0), heads),
      KOKKOS_LAMBDA(int64_t t, int64_t h) {
        const int64_t c0 = h * d;
        const float r = inv(t * heads + h);
        float dot = 0.0f;  // sum_j n_j dn_j (n unrounded: the norm's own backward)
        for (int64_t j = 0; j < d; ++j) {
          const float n = x(t, c0 + j) * r, zj = z(t, c0 + j);
          const float p = impl::rounded_if(bf16, w(j) * impl::rounded_if(bf16, n));
          const float g = gy(t, c0 + j);
          gz(t, c0 + j) =
              impl::rounded_if(bf16, g * p * activation_derivative(Activation::silu, zj));
          const float dn = impl::rounded_if(
              bf16, impl::rounded_if(bf16, g * activation_value(Activation::silu, zj)) * w(j));
          dot += n * dn;
        }
        const float mean = dot / static_cast<float>(d);
        for (int64_t j = 0; j < d; ++j) {
          const float n = x(t, c0 + j) * r, zj = z(t, c0 + j);
          const float dn = impl::rounded_if(
              bf16, impl::rounded_if(bf16, gy(t, c0 + j) * activation_value(Activation::silu, zj)) *
                        w(j));
          gx(t, c0 + j) = impl::rounded_if(bf16, r * (dn - n * mean));
        }
      });
}

}  // namespace kqlora
