#pragma once
// RMSNorm over rows of x [tokens, features] with a frozen weight w [features], of two kinds:
// Llama's (Hugging Face's LlamaRMSNorm, NormKind::scale)
//   inv = 1 / sqrt(mean(x^2) + eps)            (statistics in float32)
//   n   = x * inv, cast to the activation dtype (bfloat16 rounding when `bf16`)
//   y   = w * n                                 (rounded again when `bf16`)
// Gemma's (GemmaRMSNorm, NormKind::one_plus): y = (1 + w) * n in float32, n unrounded,
// rounded once; and gpt-oss's (GptOssRMSNorm, NormKind::float32): y = w * n in float32, n
// unrounded, rounded once (its weight in the run's dtype: transformers 5.25 keeps it in
// float32, _keep_in_fp32_modules, for float16 loads only). The backward gives the
// input gradient only (w is frozen), with w' = w or 1 + w:
//   gx = inv * (w' gy - n * mean(w' gy n))
// One team per row; the row's inv is kept for the backward.

#include <Kokkos_Core.hpp>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/blas.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

// Gemma 4's v norm (NormKind::unit): y = n in float32, rounded once, no weight (w unread).
enum class NormKind { scale, one_plus, float32, unit };

/// y = rmsnorm(x) * w; `inv` [tokens] receives each row's 1/rms (for rms_norm_backward).
template <class ExecSpace, class M>
void rms_norm_forward(const ExecSpace& exec, const Matrix<M>& x,
                      const Kokkos::View<const float*, M>& w, float eps, bool bf16,
                      const Matrix<M>& y, const Kokkos::View<float*, M>& inv,
                      NormKind kind = NormKind::scale) {
  const bool one_plus = kind == NormKind::one_plus, unit = kind == NormKind::unit;
  const bool wide = kind == NormKind::float32 || unit;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t F = x.extent(1);
  Kokkos::parallel_for(
      "kqlora::rms_norm_forward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t t = team.league_rank();
        const float ss = row_sum(team, 0, F, [&](int64_t f) { return x(t, f) * x(t, f); });
        const float r = 1.0f / sqrtf(ss / static_cast<float>(F) + eps);
        Kokkos::single(Kokkos::PerTeam(team), [&] { inv(t) = r; });
        if (one_plus || wide) {  // (1 + w) * n, w * n or n in float32, one rounding
          row_for(team, 0, F, [&](int64_t f) {
            const float v = (unit ? 1.0f : one_plus ? 1.0f + w(f) : w(f)) * (x(t, f) * r);
            y(t, f) = bf16 ? round_to_bf16(v) : v;
          });
          return;
        }
        row_for(team, 0, F, [&](int64_t f) {
          const float n = bf16 ? round_to_bf16(x(t, f) * r) : x(t, f) * r;
          const float v = w(f) * n;
          y(t, f) = bf16 ? round_to_bf16(v) : v;
        });
      });
}

/// Where rms_norm_backward's gradient goes: written to gx, or added to it (the residual
/// stream's gradient, which the norm's input also feeds: one pass where a write and a
/// residual_add made three), rounded to bfloat16 after the sum when `bf16` as residual_add.
enum class NormGradOut { write, add };

/// gx = d rmsnorm(x) * w / dx . gy, from the forward's x and inv (gx may not alias x; with
/// NormGradOut::add, gx += it, and gx may not alias gy either).
template <class ExecSpace, class M>
void rms_norm_backward(const ExecSpace& exec, const Matrix<M>& x,
                       const Kokkos::View<const float*, M>& w,
                       const Kokkos::View<const float*, M>& inv, const Matrix<M>& gy,
                       const Matrix<M>& gx, NormKind kind = NormKind::scale,
                       NormGradOut out = NormGradOut::write, bool bf16 = false) {
  const bool one_plus = kind == NormKind::one_plus, add = out == NormGradOut::add;
  const bool unit = kind == NormKind::unit;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t F = x.extent(1);
  Kokkos::parallel_for(
      "kqlora::rms_norm_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t t = team.league_rank();
        const float r = inv(t);
        const float dot = row_sum(team, 0, F, [&](int64_t f) {  // sum_f w gy n
          const float wf = unit ? 1.0f : one_plus ? 1.0f + w(f) : w(f);
          return wf * gy(t, f) * x(t, f) * r;
        });
        const float mean = dot / static_cast<float>(F);
        if (!add) {
          row_for(team, 0, F, [&](int64_t f) {
            const float wf = unit ? 1.0f : one_plus ? 1.0f + w(f) : w(f);
            gx(t, f) = r * (wf * gy(t, f) - x(t, f) * r * mean);
          });
          return;
        }
        row_for(team, 0, F, [&](int64_t f) {
          const float wf = unit ? 1.0f : one_plus ? 1.0f + w(f) : w(f);
          const float v = gx(t, f) + r * (wf * gy(t, f) - x(t, f) * r * mean);
          gx(t, f) = bf16 ? round_to_bf16(v) : v;
        });
      });
}

}  // namespace kqlora
