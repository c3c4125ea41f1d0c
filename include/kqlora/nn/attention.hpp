#pragma once
// Causal grouped-query self-attention over sequences of S tokens (tokens row-major:
// t = s * S + p): q [tokens, heads * D], k and v [tokens, kv_heads * D], output
// o [tokens, heads * D]; query head h reads kv head h / (heads / kv_heads). Per sequence
// and head: Z = scale * Q K^T, optionally soft-capped (Z = c tanh(Z / c), Gemma 2), then
// P = softmax(Z + mask) with the softmax in float32, O = P V; no dropout, no bias (Hugging
// Face's eager attention). The mask is transformers': key k is visible to query q iff
// k <= q, q - k < window (a sliding-window layer; 0: none) and k is in q's document (a
// packed row holds several: doc_start[s, q] is the position its document starts at; no
// view: the row is one document). Keys before a row block's first visible key under the
// window, or before its first row's document (packed rows), are not computed at all.
//
// The forward keeps only each row's log-sum-exp; the backward recomputes P from it (the
// [S, S] probabilities of every head never exist at once, as in FlashAttention):
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)) (* (1 - tanh^2) capped),
//   dQ = scale dS K,  dK += scale dS^T Q.
// The products go through the library's gemm (core/blas.hpp), one sequence and head at a
// time on a reused [S, S] scratch.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

struct AttentionShape {
  int64_t sequences = 0, S = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float attn_scale = 0;  // 0: 1 / sqrt(head_dim)
  float softcap = 0;     // 0: none
  int64_t window = 0;    // 0: full causal attention
  // Packed rows: each token's document start, [sequences * S] in host memory (the
  // attention's DocStarts, read where the blocks are planned); null: a document a row.
  const int32_t* host_doc_start = nullptr;
  float scale() const {
    return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  /// The first key any query of rows [i0, ...) of sequence s may see: a row's document
  /// starts no earlier than the one of the row before it.
  int64_t first_key(int64_t s, int64_t i0) const {
    const int64_t by_window = window > 0 ? std::max<int64_t>(0, i0 - window + 1) : 0;
    return host_doc_start ? std::max<int64_t>(by_window, host_doc_start[s * S + i0]) : by_window;
  }
};

/// Per token of [sequences, S]: the position its document starts at (int32).
template <class M>
using DocStarts = Kokkos::View<const int32_t**, Kokkos::LayoutRight, M>;

/// Query rows per block: a block's scores reach only up to its last row's position, so the
/// masked upper triangle is mostly not computed (at S = 256: 10 of 16 blocks of 64 x 64).
/// Measured on the 135M shape at 4 x 256 tokens, every layer's forward and backward, one
/// thread (AMD EPYC Zen 3): 1.17 - 1.30 s with blocks of 64, 1.24 - 1.29 s with 128,
/// 1.55 - 1.62 s unblocked.
constexpr int64_t kAttentionRowBlock = 64;

/// Scratch of the attention kernels: two [rows, S] blocks of scores, and a third for the
/// soft-cap's tanh.
template <class M>
struct AttentionWorkspace {
  Kokkos::View<float*, M> scores, dscores, tanh;
  void reserve(int64_t S, bool softcap) {
    const int64_t n = std::min(S, kAttentionRowBlock) * S;
    auto grow = [&](Kokkos::View<float*, M>& v, const char* label) {
      if (static_cast<int64_t>(v.extent(0)) < n)
        v = Kokkos::View<float*, M>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
    };
    grow(scores, "kqlora::attention::scores");
    grow(dscores, "kqlora::attention::dscores");
    if (softcap) grow(tanh, "kqlora::attention::tanh");
  }
  /// Floats held per [rows, S] block (the memory estimate).
  static int64_t floats(int64_t S, bool softcap) {
    return (softcap ? 3 : 2) * std::min(S, kAttentionRowBlock) * S;
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

/// What the softmax of a row block needs besides its scores.
template <class M>
struct SoftmaxRows {
  int64_t seq = 0, i0 = 0, j0 = 0;  // the sequence; column 0 is key j0, row 0 query i0
  int64_t window = 0;
  float softcap = 0;
  Matrix<M> tanh;  // softcap: tanh(Z / c) of each score, for the backward
  DocStarts<M> docs;
};

/// Row r of `p` [rows, cols] (scaled scores in, probabilities out) is query position
/// i = i0 + r, column j key j0 + j: the softmax over the visible keys in float32 (soft-capped
/// first when asked), zeros elsewhere; lse(lse0 + r) receives log(sum exp). `recompute`:
/// lse is known (the backward).
template <class ExecSpace, class M>
void causal_softmax(const ExecSpace& exec, const Matrix<M>& p, const Kokkos::View<float*, M>& lse,
                    int64_t lse0, const SoftmaxRows<M>& b, bool recompute, bool bf16) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1), i0 = b.i0, j0 = b.j0, window = b.window, seq = b.seq;
  const float cap = b.softcap;
  const auto tanh_of = b.tanh;
  const auto docs = b.docs;
  const bool has_docs = docs.data() != nullptr;
  Kokkos::parallel_for(
      recompute ? "kqlora::attention::probabilities" : "kqlora::attention::softmax",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), i = i0 + r;
        // Visible columns [lo, hi): keys from the window's and the document's start to i.
        int64_t first = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
        if (has_docs && docs(seq, i) > first) first = docs(seq, i);
        const int64_t lo = first > j0 ? first - j0 : 0, hi = i - j0 + 1;
        if (cap > 0.0f) {
          row_for(team, lo, hi, [&](int64_t j) {
            float t = 0.0f;
            p(r, j) = soft_cap(p(r, j), cap, bf16, &t);
            tanh_of(r, j) = t;
          });
          team.team_barrier();
        }
        float* x = &p(r, 0);
        if (recompute) {
          row_exp(team, x, lo, hi, lse(lse0 + r));
        } else {
          const float m = row_max(team, x, lo, hi);
          row_exp(team, x, lo, hi, m);  // one exp per score, kept
          team.team_barrier();
          const float z = row_sum(team, x, lo, hi);
          Kokkos::single(Kokkos::PerTeam(team), [&] { lse(lse0 + r) = m + logf(z); });
          row_scale(team, x, lo, hi, 1.0f / z);
        }
        row_fill(team, x, 0, lo, 0.0f);
        row_fill(team, x, hi, cols, 0.0f);
        if (bf16) row_for(team, lo, hi, [&](int64_t j) { x[j] = round_to_bf16(x[j]); });
      });
}

/// dS = P * (dP - rowsum(dO * O)) in place in dp; soft-capped scores: times 1 - tanh^2
/// (the cap's derivative; zero where P is).
template <class ExecSpace, class M, class OView>
void softmax_backward(const ExecSpace& exec, const Matrix<M>& p, const OView& o, const OView& go,
                      const Matrix<M>& dp, const Matrix<M>& tanh_of) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1), D = o.extent(1);
  const bool capped = tanh_of.data() != nullptr;
  Kokkos::parallel_for(
      "kqlora::attention::softmax_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank();
        const float d = row_sum(team, 0, D, [&](int64_t c) { return go(r, c) * o(r, c); });
        if (!capped) {  // (two loops: the common one stays a plain vectorisable pass)
          const float* pr = &p(r, 0);
          float* dr = &dp(r, 0);
          row_for(team, 0, cols, [&](int64_t j) { dr[j] = pr[j] * (dr[j] - d); });
          return;
        }
        row_for(team, 0, cols, [&](int64_t j) {
          const float ds = p(r, j) * (dp(r, j) - d);
          dp(r, j) = p(r, j) != 0.0f ? ds * (1.0f - tanh_of(r, j) * tanh_of(r, j)) : ds;
        });
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
                              const Kokkos::View<float*, M>& lse,
                              const DocStarts<M>& docs = DocStarts<M>()) {
  const int64_t S = a.S, D = a.head_dim;
  ws.reserve(S, a.softcap > 0);
  impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
    const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0;  // keys j0 .. the last query
    const Matrix<M> P(ws.scores.data(), rows, cols);
    const impl::SoftmaxRows<M> b{
        s,        i0,        j0,
        a.window, a.softcap, a.softcap > 0 ? Matrix<M>(ws.tanh.data(), rows, cols) : Matrix<M>(),
        docs};
    gemm(exec, "N", "T", a.scale(), impl::head_block(q, s, S, i0, rows, h, D),
         impl::head_block(k, s, S, j0, cols, g, D), 0.0f, P);
    if (bf16) round_bf16(exec, P);
    impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, b, false, bf16);
    gemm(exec, "N", "N", 1.0f, P, impl::head_block(v, s, S, j0, cols, g, D), 0.0f,
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
                               const Matrix<M>& gv, const DocStarts<M>& docs = DocStarts<M>()) {
  const int64_t S = a.S, D = a.head_dim;
  const float scale = a.scale();
  ws.reserve(S, a.softcap > 0);
  Kokkos::deep_copy(exec, gk, 0.0f);  // (summed over query blocks and the heads of a group)
  Kokkos::deep_copy(exec, gv, 0.0f);
  impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
    const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0;
    const auto Q = impl::head_block(q, s, S, i0, rows, h, D);
    const auto K = impl::head_block(k, s, S, j0, cols, g, D);
    const auto V = impl::head_block(v, s, S, j0, cols, g, D);
    const auto O = impl::head_block(o, s, S, i0, rows, h, D);
    const auto gO = impl::head_block(go, s, S, i0, rows, h, D);
    const Matrix<M> P(ws.scores.data(), rows, cols), dP(ws.dscores.data(), rows, cols);
    const Matrix<M> T = a.softcap > 0 ? Matrix<M>(ws.tanh.data(), rows, cols) : Matrix<M>();
    const impl::SoftmaxRows<M> b{s, i0, j0, a.window, a.softcap, T, docs};
    gemm(exec, "N", "T", scale, Q, K, 0.0f, P);
    if (bf16) round_bf16(exec, P);
    impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, b, true, bf16);
    gemm(exec, "T", "N", 1.0f, P, gO, 1.0f, impl::head_block(gv, s, S, j0, cols, g, D));
    gemm(exec, "N", "T", 1.0f, gO, V, 0.0f, dP);
    impl::softmax_backward(exec, P, O, gO, dP, T);
    gemm(exec, "N", "N", scale, dP, K, 0.0f, impl::head_block(gq, s, S, i0, rows, h, D));
    gemm(exec, "T", "N", scale, dP, Q, 1.0f, impl::head_block(gk, s, S, j0, cols, g, D));
  });
  if (bf16) {
    round_bf16(exec, gq);
    round_bf16(exec, gk);
    round_bf16(exec, gv);
  }
}

}  // namespace kqlora
