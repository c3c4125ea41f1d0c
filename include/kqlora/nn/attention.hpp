#pragma once
// Causal grouped-query self-attention over sequences of S tokens (tokens row-major:
// t = s * S + p): q [tokens, heads * D], k and v [tokens, kv_heads * D], output
// o [tokens, heads * D]; query head h reads kv head h / (heads / kv_heads). Per sequence
// and head: P = softmax(scale * Q K^T + causal mask) with the softmax in float32, O = P V,
// scale = 1 / sqrt(D); no dropout, no bias (Hugging Face's eager attention).
//
// The forward keeps only each row's log-sum-exp; the backward recomputes P from it (the
// [S, S] probabilities of every head never exist at once, as in FlashAttention):
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
//   dQ = scale dS K,  dK += scale dS^T Q.
// The products go through the library's gemm (core/blas.hpp), one sequence and head at a
// time on a reused [S, S] scratch.

#include <Kokkos_Core.hpp>

#include <cmath>

#include "kqlora/core/blas.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

struct AttentionShape {
  int64_t sequences = 0, S = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

/// Scratch of the attention kernels: two [S, S] matrices.
template <class M>
struct AttentionWorkspace {
  Matrix<M> scores, dscores;
  void reserve(int64_t S) {
    if (static_cast<int64_t>(scores.extent(0)) == S) return;
    scores = Matrix<M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::attention::scores"),
                       S, S);
    dscores = Matrix<M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::attention::dscores"), S, S);
  }
};

namespace impl {

template <class M>
auto head_block(const Matrix<M>& x, int64_t seq, int64_t S, int64_t head, int64_t D) {
  return Kokkos::subview(x, Kokkos::make_pair(seq * S, seq * S + S),
                         Kokkos::make_pair(head * D, head * D + D));
}

/// Row i of `p` (scaled scores in, probabilities out): the causal softmax over j <= i in
/// float32; lse(i) receives log(sum exp). `recompute`: p holds scores and lse is known.
template <class ExecSpace, class M>
void causal_softmax(const ExecSpace& exec, const Matrix<M>& p, const Kokkos::View<float*, M>& lse,
                    int64_t lse0, bool recompute, bool bf16) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t S = p.extent(0);
  Kokkos::parallel_for(
      recompute ? "kqlora::attention::probabilities" : "kqlora::attention::softmax",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(S), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t i = team.league_rank();
        float l = 0.0f;
        if (recompute) {
          l = lse(lse0 + i);
        } else {
          float m = -INFINITY, z = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, i + 1),
              [&](int64_t j, float& acc) { acc = p(i, j) > acc ? p(i, j) : acc; },
              Kokkos::Max<float>(m));
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, i + 1),
              [&](int64_t j, float& acc) { acc += expf(p(i, j) - m); }, z);
          l = m + logf(z);
          Kokkos::single(Kokkos::PerTeam(team), [&] { lse(lse0 + i) = l; });
        }
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, S), [&](int64_t j) {
          const float v = j <= i ? expf(p(i, j) - l) : 0.0f;
          p(i, j) = bf16 ? round_to_bf16(v) : v;
        });
      });
}

/// dS = P * (dP - rowsum(dO * O)) in place in dp.
template <class ExecSpace, class M, class OView>
void softmax_backward(const ExecSpace& exec, const Matrix<M>& p, const OView& o, const OView& go,
                      const Matrix<M>& dp) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t S = p.extent(0), D = o.extent(1);
  Kokkos::parallel_for(
      "kqlora::attention::softmax_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(S), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t i = team.league_rank();
        float d = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, D),
            [&](int64_t c, float& acc) { acc += go(i, c) * o(i, c); }, d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, S),
                             [&](int64_t j) { dp(i, j) = p(i, j) * (dp(i, j) - d); });
      });
}

}  // namespace impl

/// o = attention(q, k, v); lse [sequences * heads * S] receives each row's log-sum-exp.
template <class ExecSpace, class M>
void causal_attention_forward(const ExecSpace& exec, const AttentionShape& a, const Matrix<M>& q,
                              const Matrix<M>& k, const Matrix<M>& v, bool bf16,
                              AttentionWorkspace<M>& ws, const Matrix<M>& o,
                              const Kokkos::View<float*, M>& lse) {
  const int64_t S = a.S, D = a.head_dim, group = a.heads / a.kv_heads;
  ws.reserve(S);
  for (int64_t s = 0; s < a.sequences; ++s)
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t g = h / group;
      gemm(exec, "N", "T", a.scale(), impl::head_block(q, s, S, h, D),
           impl::head_block(k, s, S, g, D), 0.0f, ws.scores);
      if (bf16) round_bf16(exec, ws.scores);
      impl::causal_softmax(exec, ws.scores, lse, (s * a.heads + h) * S, false, bf16);
      gemm(exec, "N", "N", 1.0f, ws.scores, impl::head_block(v, s, S, g, D), 0.0f,
           impl::head_block(o, s, S, h, D));
    }
  if (bf16) round_bf16(exec, o);
}

/// From the forward's q, k, v, o, lse and the output gradient go: gq, gk, gv (written).
template <class ExecSpace, class M>
void causal_attention_backward(const ExecSpace& exec, const AttentionShape& a, const Matrix<M>& q,
                               const Matrix<M>& k, const Matrix<M>& v, const Matrix<M>& o,
                               const Kokkos::View<float*, M>& lse, const Matrix<M>& go, bool bf16,
                               AttentionWorkspace<M>& ws, const Matrix<M>& gq, const Matrix<M>& gk,
                               const Matrix<M>& gv) {
  const int64_t S = a.S, D = a.head_dim, group = a.heads / a.kv_heads;
  const float scale = a.scale();
  ws.reserve(S);
  for (int64_t s = 0; s < a.sequences; ++s)
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t g = h / group;
      const float beta = h % group == 0 ? 0.0f : 1.0f;  // kv gradients sum over the group
      const auto Q = impl::head_block(q, s, S, h, D), K = impl::head_block(k, s, S, g, D);
      const auto V = impl::head_block(v, s, S, g, D), O = impl::head_block(o, s, S, h, D);
      const auto gO = impl::head_block(go, s, S, h, D);
      gemm(exec, "N", "T", scale, Q, K, 0.0f, ws.scores);
      if (bf16) round_bf16(exec, ws.scores);
      impl::causal_softmax(exec, ws.scores, lse, (s * a.heads + h) * S, true, bf16);
      gemm(exec, "T", "N", 1.0f, ws.scores, gO, beta, impl::head_block(gv, s, S, g, D));
      gemm(exec, "N", "T", 1.0f, gO, V, 0.0f, ws.dscores);
      impl::softmax_backward(exec, ws.scores, O, gO, ws.dscores);
      gemm(exec, "N", "N", scale, ws.dscores, K, 0.0f, impl::head_block(gq, s, S, h, D));
      gemm(exec, "T", "N", scale, ws.dscores, Q, beta, impl::head_block(gk, s, S, g, D));
    }
  if (bf16) {
    round_bf16(exec, gq);
    round_bf16(exec, gk);
    round_bf16(exec, gv);
  }
}

}  // namespace kqlora
