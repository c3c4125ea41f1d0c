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

KOKKOS_INLINE_FUNCTION float conv_sum(const float* w, int64_t kernel, const float* x,
                                      int64_t stride, int64_t t, int64_t first) {
  float acc = 0.0f;
  for (int64_t j = 0; j < kernel; ++j) {
    const int64_t s = t - (kernel - 1) + j;
    if (s >= first) acc += w[j] * x[s * stride];
  }
  return acc;
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
      "kqlora::causal_conv1d_silu_forward", over(exec, x.extent(0), C),
      KOKKOS_LAMBDA(int64_t t, int64_t c) {
        float pre = impl::conv_sum(wp + c * kernel, kernel, xp + c, C, t,
                                   impl::conv_first_token(doc_start, t, S));
        if (bf16) pre = round_to_bf16(pre);
        const float v = activation_value(Activation::silu, pre);
        y(t, c) = bf16 ? round_to_bf16(v) : v;
      });
}

/// gx = the gradient of x from gy (the gradient of y), rounded to bfloat16 when `bf16`.
template <class ExecSpace, class M, class Docs>
void causal_conv1d_silu_backward(const ExecSpace& exec, const Matrix<M>& x,
                                 const Kokkos::View<const float*, M>& w, int64_t kernel, int64_t S,
                                 const Docs& doc_start, bool bf16, const Matrix<M>& gy,
                                 const Matrix<M>& gx) {
  const int64_t C = x.extent(1), T = x.extent(0);
  const float* xp = x.data();
  const float* wp = w.data();
  Kokkos::parallel_for(
      "kqlora::causal_conv1d_silu_backward", over(exec, T, C), KOKKOS_LAMBDA(int64_t s, int64_t c) {
        // x[s] feeds the outputs t = s + (kernel - 1) - j of its own document and row.
        const int64_t row_end = (s / S + 1) * S;
        float acc = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) {
          const int64_t t = s + (kernel - 1) - j;
          if (t >= row_end) continue;
          const int64_t first = impl::conv_first_token(doc_start, t, S);
          if (s < first) continue;  // (t is in a later document)
          float pre = impl::conv_sum(wp + c * kernel, kernel, xp + c, C, t, first);
          if (bf16) pre = round_to_bf16(pre);
          float d = gy(t, c) * activation_derivative(Activation::silu, pre);
          if (bf16) d = round_to_bf16(d);
          acc += wp[c * kernel + j] * d;
        }
        gx(s, c) = bf16 ? round_to_bf16(acc) : acc;
      });
}

}  // namespace kqlora
