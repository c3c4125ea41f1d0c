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

#include <algorithm>
#include <cmath>

#include "kqlora/core/blas.hpp"
#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

struct AttentionShape {
  int64_t sequences = 0, S = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

/// Query rows per block: a block's scores reach only up to its last row's position, so the
/// masked upper triangle is mostly not computed (at S = 256: 10 of 16 blocks of 64 x 64).
/// Measured on the 135M shape at 4 x 256 tokens, every layer's forward and backward, one
/// thread (AMD EPYC Zen 3): 1.17 - 1.30 s with blocks of 64, 1.24 - 1.29 s with 128,
/// 1.55 - 1.62 s unblocked.
constexpr int64_t kAttentionRowBlock = 64;

/// Scratch of the attention kernels: two [rows, S] blocks of scores.
template <class M>
struct AttentionWorkspace {
  Kokkos::View<float*, M> scores, dscores;
  void reserve(int64_t S) {
    const int64_t n = std::min(S, kAttentionRowBlock) * S;
    if (static_cast<int64_t>(scores.extent(0)) >= n) return;
    scores = Kokkos::View<float*, M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::attention::scores"), n);
    dscores = Kokkos::View<float*, M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::attention::dscores"), n);
  }
};

namespace impl {

/// Rows [row0, row0 + rows) and head `head` of sequence `seq`'s [tokens, heads * D] block.
template <class M>
auto head_block(const Matrix<M>& x, int64_t seq, int64_t S, int64_t row0, int64_t rows,
                int64_t head, int64_t D) {
  return Kokkos::subview(x, Kokkos::make_pair(seq * S + row0, seq * S + row0 + rows),
                         Kokkos::make_pair(head * D, head * D + D));
}

/// Row r of `p` [rows, cols] (scaled scores in, probabilities out) is query position
/// i = i0 + r: the causal softmax over j <= i in float32, zeros past it; lse(lse0 + r)
/// receives log(sum exp). `recompute`: lse is known (the backward).
template <class ExecSpace, class M>
void causal_softmax(const ExecSpace& exec, const Matrix<M>& p, const Kokkos::View<float*, M>& lse,
                    int64_t lse0, int64_t i0, bool recompute, bool bf16) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1);
  Kokkos::parallel_for(
      recompute ? "kqlora::attention::probabilities" : "kqlora::attention::softmax",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), i = i0 + r;
        float l = 0.0f;
        if (recompute) {
          l = lse(lse0 + r);
        } else {
          float m = -INFINITY, z = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, i + 1),
              [&](int64_t j, float& acc) { acc = p(r, j) > acc ? p(r, j) : acc; },
              Kokkos::Max<float>(m));
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, i + 1),
              [&](int64_t j, float& acc) {
                const float e = expf(p(r, j) - m);  // one exp per score, kept
                p(r, j) = e;
                acc += e;
              },
              z);
          Kokkos::single(Kokkos::PerTeam(team), [&] { lse(lse0 + r) = m + logf(z); });
          const float inv = 1.0f / z;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int64_t j) {
            const float v = j <= i ? p(r, j) * inv : 0.0f;
            p(r, j) = bf16 ? round_to_bf16(v) : v;
          });
          return;
        }
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int64_t j) {
          const float v = j <= i ? expf(p(r, j) - l) : 0.0f;
          p(r, j) = bf16 ? round_to_bf16(v) : v;
        });
      });
}

/// dS = P * (dP - rowsum(dO * O)) in place in dp.
template <class ExecSpace, class M, class OView>
void softmax_backward(const ExecSpace& exec, const Matrix<M>& p, const OView& o, const OView& go,
                      const Matrix<M>& dp) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1), D = o.extent(1);
  Kokkos::parallel_for(
      "kqlora::attention::softmax_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank();
        float d = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, D),
            [&](int64_t c, float& acc) { acc += go(r, c) * o(r, c); }, d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols),
                             [&](int64_t j) { dp(r, j) = p(r, j) * (dp(r, j) - d); });
      });
}

/// Calls f(s, h, g, i0, rows) for every sequence, query head (g its kv head) and block of
/// query rows.
template <class F>
void for_each_block(const AttentionShape& a, F&& f) {
  const int64_t group = a.heads / a.kv_heads;
  for (int64_t s = 0; s < a.sequences; ++s)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i0 = 0; i0 < a.S; i0 += kAttentionRowBlock)
        f(s, h, h / group, i0, std::min(kAttentionRowBlock, a.S - i0));
}

}  // namespace impl

/// o = attention(q, k, v); lse [sequences * heads * S] receives each row's log-sum-exp.
template <class ExecSpace, class M>
void causal_attention_forward(const ExecSpace& exec, const AttentionShape& a, const Matrix<M>& q,
                              const Matrix<M>& k, const Matrix<M>& v, bool bf16,
                              AttentionWorkspace<M>& ws, const Matrix<M>& o,
                              const Kokkos::View<float*, M>& lse) {
  const int64_t S = a.S, D = a.head_dim;
  ws.reserve(S);
  impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
    const int64_t cols = i0 + rows;  // keys 0 .. the block's last query
    const Matrix<M> P(ws.scores.data(), rows, cols);
    gemm(exec, "N", "T", a.scale(), impl::head_block(q, s, S, i0, rows, h, D),
         impl::head_block(k, s, S, 0, cols, g, D), 0.0f, P);
    if (bf16) round_bf16(exec, P);
    impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, i0, false, bf16);
    gemm(exec, "N", "N", 1.0f, P, impl::head_block(v, s, S, 0, cols, g, D), 0.0f,
         impl::head_block(o, s, S, i0, rows, h, D));
  });
  if (bf16) round_bf16(exec, o);
}

/// From the forward's q, k, v, o, lse and the output gradient go: gq, gk, gv (written).
template <class ExecSpace, class M>
void causal_attention_backward(const ExecSpace& exec, const AttentionShape& a, const Matrix<M>& q,
                               const Matrix<M>& k, const Matrix<M>& v, const Matrix<M>& o,
                               const Kokkos::View<float*, M>& lse, const Matrix<M>& go, bool bf16,
                               AttentionWorkspace<M>& ws, const Matrix<M>& gq, const Matrix<M>& gk,
                               const Matrix<M>& gv) {
  const int64_t S = a.S, D = a.head_dim;
  const float scale = a.scale();
  ws.reserve(S);
  Kokkos::deep_copy(exec, gk, 0.0f);  // (summed over query blocks and the heads of a group)
  Kokkos::deep_copy(exec, gv, 0.0f);
  impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
    const int64_t cols = i0 + rows;
    const auto Q = impl::head_block(q, s, S, i0, rows, h, D);
    const auto K = impl::head_block(k, s, S, 0, cols, g, D);
    const auto V = impl::head_block(v, s, S, 0, cols, g, D);
    const auto O = impl::head_block(o, s, S, i0, rows, h, D);
    const auto gO = impl::head_block(go, s, S, i0, rows, h, D);
    const Matrix<M> P(ws.scores.data(), rows, cols), dP(ws.dscores.data(), rows, cols);
    gemm(exec, "N", "T", scale, Q, K, 0.0f, P);
    if (bf16) round_bf16(exec, P);
    impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, i0, true, bf16);
    gemm(exec, "T", "N", 1.0f, P, gO, 1.0f, impl::head_block(gv, s, S, 0, cols, g, D));
    gemm(exec, "N", "T", 1.0f, gO, V, 0.0f, dP);
    impl::softmax_backward(exec, P, O, gO, dP);
    gemm(exec, "N", "N", scale, dP, K, 0.0f, impl::head_block(gq, s, S, i0, rows, h, D));
    gemm(exec, "T", "N", scale, dP, Q, 1.0f, impl::head_block(gk, s, S, 0, cols, g, D));
  });
  if (bf16) {
    round_bf16(exec, gq);
    round_bf16(exec, gk);
    round_bf16(exec, gv);
  }
}

}  // namespace kqlora
