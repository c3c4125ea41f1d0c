#pragma once
// Gated DeltaNet's short causal depthwise convolution with SiLU (docs/MODELS.md, "Gated
// DeltaNet"): per channel c of x [tokens, channels], with the frozen weight w [channels,
// kernel] (conv1d.weight [channels, 1, kernel] flattened),
//   pre[t, c] = sum_j w[c, j] x[t - (kernel - 1) + j, c]    (x before the document's start: 0)
//   y[t, c]   = silu(pre[t, c])
// as transformers' F.conv1d with padding kernel - 1 and its first outputs kept. A bfloat16
// run rounds the convolution's sum, then the SiLU, as PyTorch's bfloat16 conv1d and silu
// do. Packed rows: each document starts from zeros (`doc_start`, per token its document's
// first token in the row). The backward recomputes pre from x; the weight is frozen.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

namespace impl {

/// The first token t's window may read: its document's, in row-major token order.
template <class Docs>
KOKKOS_INLINE_FUNCTION int64_t conv_first_token(const Docs& doc_start, int64_t t, int64_t S) {
  return doc_start.data() ? (t / S) * S + doc_start(t / S, t % S) : (t / S) * S;
}

/// Row t's pre-activations into pre[0, C): pre[c] = sum_j w[c, j] x[t - (kernel - 1) + j, c]
/// over the taps inside [first, t] (a token at a time, the channels contiguous).
KOKKOS_INLINE_FUNCTION void conv_row(const float* w, int64_t kernel, const float* x, int64_t C,
                                     int64_t t, int64_t first, float* pre) {
  for (int64_t c = 0; c < C; ++c) pre[c] = 0.0f;
  for (int64_t j = 0; j < kernel; ++j) {
    const int64_t s = t - (kernel - 1) + j;
    if (s < first) continue;
    const float* xs = x + s * C;
    for (int64_t c = 0; c < C; ++c) pre[c] += w[c * kernel + j] * xs[c];
  }
}

}  // namespace impl

/// y = silu(causal depthwise conv of x) for rows of S tokens (y may not alias x).
template <class ExecSpace, class M, class Docs>
void causal_conv1d_silu_forward(const ExecSpace& exec, const Matrix<M>& x,
                                const Kokkos::View<const float*, M>& w, int64_t kernel, int64_t S,
                                const Docs& doc_start, bool bf16, const Matrix<M>& y) {
  const int64_t C = x.extent(1);
  const float* xp = x.data();
  const float* wp = w.data();
  Kokkos::parallel_for(
      "kqlora::causal_conv1d_silu_forward",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        float* out = &y(t, 0);
        impl::conv_row(wp, kernel, xp, C, t, impl::conv_first_token(doc_start, t, S), out);
        for (int64_t c = 0; c < C; ++c) {
          const float pre = bf16 ? round_to_bf16(out[c]) : out[c];
          const float v = activation_value(Activation::silu, pre);
          out[c] = bf16 ? round_to_bf16(v) : v;
        }
      });
}

/// gx = the gradient of x from gy (the gradient of y), rounded to bfloat16 when `bf16`.
/// gy is overwritten with the gradient of the convolution's sum (gy silu'(pre)): one pass
/// computes it (the pre-activations into gx's row as scratch), a second sums it back
/// through the taps. gx may not alias x or gy.
template <class ExecSpace, class M, class Docs>
void causal_conv1d_silu_backward(const ExecSpace& exec, const Matrix<M>& x,
                                 const Kokkos::View<const float*, M>& w, int64_t kernel, int64_t S,
                                 const Docs& doc_start, bool bf16, const Matrix<M>& gy,
                                 const Matrix<M>& gx) {
  const int64_t C = x.extent(1), T = x.extent(0);
  const float* xp = x.data();
  const float* wp = w.data();
  using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>;
  Kokkos::parallel_for(
      "kqlora::causal_conv1d_silu_backward::pre", Range(exec, 0, T), KOKKOS_LAMBDA(int64_t t) {
        float* pre = &gx(t, 0);
        impl::conv_row(wp, kernel, xp, C, t, impl::conv_first_token(doc_start, t, S), pre);
        float* g = &gy(t, 0);
        for (int64_t c = 0; c < C; ++c) {
          const float p = bf16 ? round_to_bf16(pre[c]) : pre[c];
          const float d = g[c] * activation_derivative(Activation::silu, p);
          g[c] = bf16 ? round_to_bf16(d) : d;
        }
      });
  Kokkos::parallel_for(
      "kqlora::causal_conv1d_silu_backward", Range(exec, 0, T), KOKKOS_LAMBDA(int64_t s) {
        // x[s] feeds the outputs t = s + (kernel - 1) - j of its own document and row.
        float* out = &gx(s, 0);
        for (int64_t c = 0; c < C; ++c) out[c] = 0.0f;
        const int64_t row_end = (s / S + 1) * S;
        for (int64_t j = 0; j < kernel; ++j) {
          const int64_t t = s + (kernel - 1) - j;
          if (t >= row_end || s < impl::conv_first_token(doc_start, t, S)) continue;
          const float* g = &gy(t, 0);
          for (int64_t c = 0; c < C; ++c) out[c] += wp[c * kernel + j] * g[c];
        }
        if (bf16)
          for (int64_t c = 0; c < C; ++c) out[c] = round_to_bf16(out[c]);
      });
}

}  // namespace kqlora
