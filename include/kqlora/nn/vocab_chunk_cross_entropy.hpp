#pragma once
// The cross-entropy of a pass of tokens over the head in vocabulary chunks, with an
// online log-sum-exp (as a flash attention over the vocabulary): for each chunk c of the
// head's rows W_c, with the chunk's logits lg = h W_c^T,
//   m_t    = max(m_t, max_v lg[t, v])                 (the running maximum)
//   sum_t  = sum_t exp(m_old - m_t) + sum_v exp(lg[t, v] - m_t)
//   G_t    = G_t exp(m_old - m_t) + sum_v exp(lg[t, v] - m_t) W_c[v]
// and at the end loss_t = log(sum_t) + m_t - lg[t, label], and the logits' gradient times
// the head, gh_t = (G_t / sum_t - W[label]) / normaliser. Each of the two products reads
// the head once a pass, for all of its tokens, and the chunk's logits stay in cache
// between them (nn/lm_head_cross_entropy.hpp has the numbers). Under a final-logit soft-cap the
// logits are capped first and each term of G and the label's row carry the cap's derivative 1 -
// tanh^2.

#include <Kokkos_Core.hpp>

#include <cmath>

#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

/// Each token's running state over the vocabulary chunks of one pass.
template <class M>
struct VocabChunkRows {
  Kokkos::View<float*, M> max, sum, target, dcap, rescale;

  VocabChunkRows() = default;
  explicit VocabChunkRows(int64_t tokens)
      : max(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::max"), tokens),
        sum(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::sum"), tokens),
        target(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::target"),
               tokens),
        dcap(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::dcap"),
             tokens),
        rescale(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::rescale"),
                tokens) {}
  static constexpr int64_t kFloatsPerToken = 5;
  int64_t capacity() const { return static_cast<int64_t>(max.extent(0)); }
};

namespace impl {

/// The label token t's logits are scored against (kIgnoreLabel: none).
template <class M>
KOKKOS_INLINE_FUNCTION int32_t next_token_label(const TokenMatrix<M>& labels, int64_t t) {
  const int64_t S = labels.extent(1), p = t % S;
  return p + 1 < S ? labels(t / S, p + 1) : kIgnoreLabel;
}

}  // namespace impl

/// The label of each row of a call's hidden states: row t is token t, or, over the scored
/// tokens only (lm_head_cross_entropy's HiddenAfter::scratch), token token_of(t).
template <class M>
struct RowLabels {
  TokenMatrix<M> labels;
  Kokkos::View<const int32_t*, M> token_of;  // (empty: row t is token t)
  explicit RowLabels(const TokenMatrix<M>& l) : labels(l) {}
  RowLabels(const TokenMatrix<M>& l, const Kokkos::View<const int32_t*, M>& rows)
      : labels(l), token_of(rows) {}
  KOKKOS_INLINE_FUNCTION int32_t operator()(int64_t t) const {
    return impl::next_token_label(labels, token_of.data() ? token_of(t) : t);
  }
};

namespace impl {

/// The state of n tokens before the first chunk.
template <class ExecSpace, class M>
void vocab_chunk_start(const ExecSpace& exec, const VocabChunkRows<M>& st, int64_t n) {
  Kokkos::parallel_for(
      "kqlora::cross_entropy::start",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t r) {
        st.max(r) = -INFINITY;
        st.sum(r) = 0.0f;
        st.target(r) = 0.0f;
        st.dcap(r) = 1.0f;
        st.rescale(r) = 1.0f;
      });
}

/// One chunk's logits lg [n, vc] (vocabulary entries v0 ..) folded into the state; with
/// `grad`, lg then holds each term's weight in G: exp(lg - m) (times the cap's
/// derivative), 0 for unscored tokens, and st.rescale the factor of G's earlier terms.
template <class ExecSpace, class M>
void vocab_chunk_softmax(const ExecSpace& exec, const Matrix<M>& lg, const RowLabels<M>& labels,
                         int64_t t0, int64_t v0, float cap, bool grad,
                         const VocabChunkRows<M>& st) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t vc = lg.extent(1);
  Kokkos::parallel_for(
      "kqlora::cross_entropy::vocab_chunk",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(lg.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank();
        const int32_t label = labels(t0 + r);
        float* x = &lg(r, 0);
        if (label == kIgnoreLabel) {
          if (grad) row_fill(team, x, 0, vc, 0.0f);
          return;
        }
        if (cap > 0.0f) {
          // (float32: c tanh(x / c) through the inline tanh, as soft_cap does with libm's)
          row_for(team, 0, vc, [&](int64_t v) { x[v] = fast_tanh(x[v] / cap) * cap; });
          team.team_barrier();
        }
        const float m_old = st.max(r), mc = row_max(team, x, 0, vc);
        const float m = mc > m_old ? mc : m_old;
        const int64_t at = label - v0;
        const bool here = at >= 0 && at < vc;
        const float target = here ? x[at] : 0.0f;
        team.team_barrier();  // (everyone has read x[at] before it changes)
        float z = 0.0f;
        if (cap > 0.0f) {
          z = row_sum(team, 0, vc, [&](int64_t v) { return fast_exp(x[v] - m); });
          if (grad) {
            team.team_barrier();
            row_for(team, 0, vc, [&](int64_t v) {
              const float th = x[v] / cap;  // (tanh of the capped logit)
              x[v] = fast_exp(x[v] - m) * (1.0f - th * th);
            });
          }
        } else {
          row_exp(team, x, 0, vc, m);
          team.team_barrier();
          z = row_sum(team, x, 0, vc);
        }
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          const float a = fast_exp(m_old - m);  // (0 at the first chunk, 1 if m held)
          st.sum(r) = st.sum(r) * a + z;
          st.max(r) = m;
          st.rescale(r) = a;
          if (here) {
            st.target(r) = target;
            st.dcap(r) = cap > 0.0f ? 1.0f - (target / cap) * (target / cap) : 1.0f;
          }
        });
      });
}

/// G's rows times st.rescale, where the running maximum moved.
template <class ExecSpace, class M, class G>
void vocab_chunk_rescale(const ExecSpace& exec, const VocabChunkRows<M>& st, const G& g) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t H = g.extent(1);
  Kokkos::parallel_for(
      "kqlora::cross_entropy::rescale",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(g.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank();
        const float a = st.rescale(r);
        if (a != 1.0f) row_scale(team, &g(r, 0), 0, H, a);
      });
}

/// Each token's loss into row_loss(t0 + r); with g non-empty, G turned into the gradient.
template <class ExecSpace, class M, class G, class W>
void vocab_chunk_finish(const ExecSpace& exec, const RowLabels<M>& labels, int64_t t0, int64_t n,
                        float inv, const W& head, const VocabChunkRows<M>& st,
                        const Kokkos::View<double*, M>& row_loss, const G& g) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const bool grad = g.data() != nullptr;
  const int64_t H = head.extent(1);
  Kokkos::parallel_for(
      "kqlora::cross_entropy::finish",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(n), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), t = t0 + r;
        const int32_t label = labels(t);
        if (label == kIgnoreLabel) {
          Kokkos::single(Kokkos::PerTeam(team), [&] { row_loss(t) = 0.0; });
          if (grad) row_fill(team, &g(r, 0), 0, H, 0.0f);
          return;
        }
        const float s = st.sum(r);
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          row_loss(t) = static_cast<double>(logf(s)) + static_cast<double>(st.max(r)) -
                        static_cast<double>(st.target(r));
        });
        if (!grad) return;
        const float a = inv / s, b = inv * st.dcap(r);
        float* gr = &g(r, 0);
        const float* w = &head(label, 0);
        row_for(team, 0, H, [&](int64_t f) { gr[f] = gr[f] * a - b * w[f]; });
      });
}

}  // namespace impl

}  // namespace kqlora
