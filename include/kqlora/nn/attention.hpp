#pragma once
// Causal grouped-query self-attention over sequences of S tokens (tokens row-major:
// t = s * S + p): q [tokens, heads * D], k and v [tokens, kv_heads * D], output
// o [tokens, heads * D]; query head h reads kv head h / (heads / kv_heads). Per sequence
// and head: Z = scale * Q K^T, optionally soft-capped (Z = c tanh(Z / c), Gemma 2), then
// P = softmax(Z + mask) with the softmax in float32, O = P V; no dropout, no bias (Hugging
// Face's eager attention). With sinks (gpt-oss), head h's softmax has one more logit s_h
// in its denominator and no value: the row's log-sum-exp takes it in, and the backward,
// recomputing P from that, is otherwise unchanged. The mask is transformers': key k is visible to
// query q iff k <= q, q - k < window (a sliding-window layer; 0: none) and k is in q's document (a
// packed row holds several: doc_start[s, q] is the position its document starts at; no
// view: the row is one document). Keys before a row block's first visible key under the
// window, or before its first row's document (packed rows), are not computed at all.
//
// The forward keeps only each row's log-sum-exp; the backward recomputes P from it (the
// [S, S] probabilities of every head never exist at once, as in FlashAttention):
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)) (* (1 - tanh^2) capped),
//   dQ = scale dS K,  dK += scale dS^T Q.
// On a host in float32 (AVX-512 builds) one fused kernel runs it, a sequence and kv head
// per work item, every product through its own register tile (nn/attention_host.hpp).
// Otherwise the products go through the library's gemm (core/blas.hpp) on a reused scratch
// of 64-row blocks: on a host one sequence, head and row block at a time (the blocks stay
// in cache); on a GPU every head of a row block at once: the products as strided-batched
// cuBLAS calls over the kv heads (one a query head of each group) and each softmax pass as
// one kernel over all heads' rows, a few launches per block where one head at a time made
// 3-4 forward and 7 backward per head (docs/GPU.md).

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/attention_host.hpp"
#include "kqlora/nn/attention_shape.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

/// Per token of [sequences, S]: the position its document starts at (int32).
template <class M>
using DocStarts = Kokkos::View<const int32_t**, Kokkos::LayoutRight, M>;

/// Whether the attention runs every head of a row block at once by default: on a GPU
/// (a host keeps one head at a time, in cache).
template <class M>
constexpr bool attention_batches_heads() {
  return !std::is_same<M, Kokkos::HostSpace>::value;
}

/// Scratch of the attention kernels: two [rows, S] blocks of scores, and a third for the
/// soft-cap's tanh; a block per head when the heads run at once. The host's fused float32
/// kernel (nn/attention_host.hpp) has its own: K^T, V^T and the blocks per thread.
template <class M>
struct AttentionWorkspace {
  Kokkos::View<float*, M> scores, dscores, tanh, fused;
  /// Every head of a row block at once (strided-batched products); the memory space's
  /// default unless set (tests run both ways on a host).
  bool batch_heads = attention_batches_heads<M>();
  /// The host's fused kernel for float32 where built (tests turn it off to check the gemm
  /// path too).
  bool fused_host = true;
  void reserve(int64_t S, bool softcap, int64_t heads = 1) {
    const int64_t n = std::min(S, kAttentionRowBlock) * S * (batch_heads ? heads : 1);
    grow(scores, "kqlora::attention::scores", n);
    grow(dscores, "kqlora::attention::dscores", n);
    if (softcap) grow(tanh, "kqlora::attention::tanh", n);
  }
  void reserve_fused(int64_t S, int64_t head_dim, bool softcap) {
    grow(fused, "kqlora::attention::fused",
         impl::host_fused_attention_concurrency() *
             impl::host_fused_attention_item_floats(S, head_dim, softcap));
  }
  /// Floats held at most (the memory estimate): the gemm path's blocks of `heads` heads at
  /// once, or on a host the fused kernel's scratch.
  static int64_t floats(int64_t S, bool softcap, int64_t heads, int64_t head_dim) {
    const int64_t blocks = (softcap ? 3 : 2) * std::min(S, kAttentionRowBlock) * S * heads;
    if (!std::is_same<M, Kokkos::HostSpace>::value || !impl::host_fused_attention_built())
      return blocks;
    return std::max(blocks, impl::host_fused_attention_concurrency() *
                                impl::host_fused_attention_item_floats(S, head_dim, softcap));
  }

 private:
  static void grow(Kokkos::View<float*, M>& v, const char* label, int64_t n) {
    if (static_cast<int64_t>(v.extent(0)) < n)
      v = Kokkos::View<float*, M>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
  }
};

namespace impl {

/// Whether a call takes the host's fused float32 kernel.
template <class M>
bool takes_fused_host_attention(const AttentionWorkspace<M>& ws, bool bf16) {
  return std::is_same<M, Kokkos::HostSpace>::value && !ws.batch_heads && ws.fused_host && !bf16 &&
         host_fused_attention_built();
}

/// The fused kernel reads raw pointers: the operands' shapes it assumes, checked, and the
/// document starts (packed rows) never decreasing along a row, which its row tiles assume
/// (each starts at its first row's first key; the data loader checks the positions).
template <class M>
void check_fused_attention(const AttentionShape& a, std::initializer_list<const Matrix<M>*> q_like,
                           std::initializer_list<const Matrix<M>*> kv_like,
                           const Kokkos::View<float*, M>& lse, const DocStarts<M>& docs) {
  const int64_t T = a.sequences * a.S, D = a.head_dim;
  KQLORA_CHECK(a.kv_heads > 0 && a.heads % a.kv_heads == 0 &&
                   static_cast<int64_t>(lse.extent(0)) >= a.sequences * a.heads * a.S,
               "causal attention: " << a.heads << " heads over " << a.kv_heads
                                    << " kv heads, log-sum-exp of " << lse.extent(0));
  for (const auto* x : q_like)
    KQLORA_CHECK(
        static_cast<int64_t>(x->extent(0)) == T &&
            static_cast<int64_t>(x->extent(1)) >= a.heads * D && x->stride(1) == 1,
        "causal attention: a query-shaped operand of " << x->extent(0) << " x " << x->extent(1));
  for (const auto* x : kv_like)
    KQLORA_CHECK(
        static_cast<int64_t>(x->extent(0)) == T &&
            static_cast<int64_t>(x->extent(1)) >= a.kv_heads * D && x->stride(1) == 1,
        "causal attention: a key-shaped operand of " << x->extent(0) << " x " << x->extent(1));
  if constexpr (!std::is_same<M, Kokkos::HostSpace>::value) return;  // (the host's kernel)
  if (docs.data() == nullptr) return;
  KQLORA_CHECK(
      static_cast<int64_t>(docs.extent(0)) == a.sequences &&
          static_cast<int64_t>(docs.extent(1)) == a.S && docs.span_is_contiguous(),
      "causal attention: document starts of " << docs.extent(0) << " x " << docs.extent(1));
  for (int64_t s = 0; s < a.sequences; ++s)
    for (int64_t i = 0; i < a.S; ++i)
      KQLORA_CHECK(docs(s, i) >= 0 && docs(s, i) <= i && (i == 0 || docs(s, i) >= docs(s, i - 1)),
                   "causal attention: document start " << docs(s, i) << " at position " << i
                                                       << " of row " << s);
}

template <class M>
HostHeads host_heads(const Matrix<M>& x) {
  return HostHeads{x.data(), static_cast<int64_t>(x.stride(0))};
}

template <class M>
HostHeadsOut host_heads_out(const Matrix<M>& x) {
  return HostHeadsOut{x.data(), static_cast<int64_t>(x.stride(0))};
}

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
  const float* sinks = nullptr;  // AttentionShape::sinks
  int64_t head0 = 0;             // the head of the first row block
};

/// `p` [heads x rows, cols] holds the row blocks of one or more heads one after the other
/// (scaled scores in, probabilities out): its row h * rows + r is query position i = i0 + r
/// of the h-th of them, column j key j0 + j. The softmax over the visible keys in float32
/// (soft-capped first when asked), zeros elsewhere; lse(lse0 + h * lse_head + r) receives
/// log(sum exp). `recompute`: lse is known (the backward).
template <class ExecSpace, class M>
void causal_softmax(const ExecSpace& exec, const Matrix<M>& p, const Kokkos::View<float*, M>& lse,
                    int64_t lse0, int64_t rows, int64_t lse_head, const SoftmaxRows<M>& b,
                    bool recompute, bool bf16) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1), i0 = b.i0, j0 = b.j0, window = b.window, seq = b.seq;
  const float cap = b.softcap;
  const auto tanh_of = b.tanh;
  const auto docs = b.docs;
  const bool has_docs = docs.data() != nullptr;
  const float* sinks = b.sinks;
  const int64_t head0 = b.head0;
  Kokkos::parallel_for(
      recompute ? "kqlora::attention::probabilities" : "kqlora::attention::softmax",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), i = i0 + r % rows;
        const int64_t at = lse0 + (r / rows) * lse_head + r % rows;
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
          row_exp(team, x, lo, hi, lse(at));
        } else {
          const float m = row_max(team, x, lo, hi);
          row_exp(team, x, lo, hi, m);  // one exp per score, kept
          team.team_barrier();
          const float z = row_sum(team, x, lo, hi);
          float top = m, total = z;  // (a sink: one more term, no value)
          if (sinks) {
            const float sink = sinks[head0 + r / rows];
            top = sink > m ? sink : m;
            total = z * expf(m - top) + expf(sink - top);
          }
          Kokkos::single(Kokkos::PerTeam(team), [&] { lse(at) = top + logf(total); });
          row_scale(team, x, lo, hi, expf(m - top) / total);
        }
        row_fill(team, x, 0, lo, 0.0f);
        row_fill(team, x, hi, cols, 0.0f);
        if (bf16) row_for(team, lo, hi, [&](int64_t j) { x[j] = round_to_bf16(x[j]); });
      });
}

/// dS = P * (dP - rowsum(dO * O)) in place in dp; soft-capped scores: times 1 - tanh^2
/// (the cap's derivative; zero where P is). p, dp [heads x rows, cols] as causal_softmax's;
/// row h * rows + r's output and its gradient are row token0 + r, columns (head0 + h) * D
/// onwards, of o and go [tokens, heads * D].
template <class ExecSpace, class M>
void softmax_backward(const ExecSpace& exec, const Matrix<M>& p, const Matrix<M>& o,
                      const Matrix<M>& go, int64_t token0, int64_t rows, int64_t head0, int64_t D,
                      const Matrix<M>& dp, const Matrix<M>& tanh_of) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t cols = p.extent(1);
  const bool capped = tanh_of.data() != nullptr;
  Kokkos::parallel_for(
      "kqlora::attention::softmax_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(p.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), t = token0 + r % rows, c0 = (head0 + r / rows) * D;
        const float d =
            row_sum(team, 0, D, [&](int64_t c) { return go(t, c0 + c) * o(t, c0 + c); });
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

/// Calls f(s, i0, rows) for every sequence and block of query rows (every head at once).
template <class F>
void for_each_row_block(const AttentionShape& a, F&& f) {
  for (int64_t s = 0; s < a.sequences; ++s)
    for (int64_t i0 = 0; i0 < a.S; i0 += kAttentionRowBlock)
      f(s, i0, std::min(kAttentionRowBlock, a.S - i0));
}

/// A head's [rows, cols] block of a score buffer that holds every head's, one after the
/// other.
template <class M>
Matrix<M> head_scores(const Matrix<M>& all, int64_t h, int64_t rows, int64_t cols) {
  return Matrix<M>(all.data() + h * rows * cols, rows, cols);
}

// Every head of a row block at once. Query head h = g * group + r reads kv head g; for each
// r the products of heads r, group + r, 2 group + r, ... against kv heads 0, 1, 2, ... are
// one strided-batched call (query columns group * D apart, kv columns D, score blocks
// group * rows * cols), so no two products of a call write the same kv head's gradient.

/// The forward of every head of each row block at once.
template <class ExecSpace, class M>
void attention_forward_all_heads(const ExecSpace& exec, const AttentionShape& a, const Matrix<M>& q,
                                 const Matrix<M>& k, const Matrix<M>& v, bool bf16,
                                 AttentionWorkspace<M>& ws, const Matrix<M>& o,
                                 const Kokkos::View<float*, M>& lse, const DocStarts<M>& docs) {
  const int64_t S = a.S, D = a.head_dim, H = a.heads, G = a.kv_heads, group = H / G;
  const GemmInputs in = bf16 ? GemmInputs::bfloat16 : GemmInputs::float32;
  for_each_row_block(a, [&](int64_t s, int64_t i0, int64_t rows) {
    const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0, block = rows * cols;
    const Matrix<M> P(ws.scores.data(), H * rows, cols);
    const SoftmaxRows<M> b{
        s,         i0,
        j0,        a.window,
        a.softcap, a.softcap > 0 ? Matrix<M>(ws.tanh.data(), H * rows, cols) : Matrix<M>(),
        docs,      a.sinks};
    for (int64_t r = 0; r < group; ++r)
      gemm_strided_batched(exec, "N", "T", a.scale(), head_block(q, s, S, i0, rows, r, D),
                           group * D, head_block(k, s, S, j0, cols, 0, D), D, 0.0f,
                           head_scores(P, r, rows, cols), group * block, G, in);
    if (bf16) round_bf16(exec, P);
    causal_softmax(exec, P, lse, s * H * S + i0, rows, S, b, false, bf16);
    for (int64_t r = 0; r < group; ++r)
      gemm_strided_batched(exec, "N", "N", 1.0f, head_scores(P, r, rows, cols), group * block,
                           head_block(v, s, S, j0, cols, 0, D), D, 0.0f,
                           head_block(o, s, S, i0, rows, r, D), group * D, G, in);
  });
}

/// The backward of every head of each row block at once (gk, gv zeroed by the caller).
template <class ExecSpace, class M>
void attention_backward_all_heads(const ExecSpace& exec, const AttentionShape& a,
                                  const Matrix<M>& q, const Matrix<M>& k, const Matrix<M>& v,
                                  const Matrix<M>& o, const Kokkos::View<float*, M>& lse,
                                  const Matrix<M>& go, bool bf16, AttentionWorkspace<M>& ws,
                                  const Matrix<M>& gq, const Matrix<M>& gk, const Matrix<M>& gv,
                                  const DocStarts<M>& docs) {
  const int64_t S = a.S, D = a.head_dim, H = a.heads, G = a.kv_heads, group = H / G;
  const float scale = a.scale();
  // (the probabilities recomputed as the forward computed them)
  const GemmInputs in = bf16 ? GemmInputs::bfloat16 : GemmInputs::float32;
  for_each_row_block(a, [&](int64_t s, int64_t i0, int64_t rows) {
    const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0, block = rows * cols;
    const Matrix<M> P(ws.scores.data(), H * rows, cols), dP(ws.dscores.data(), H * rows, cols);
    const Matrix<M> T = a.softcap > 0 ? Matrix<M>(ws.tanh.data(), H * rows, cols) : Matrix<M>();
    const SoftmaxRows<M> b{s, i0, j0, a.window, a.softcap, T, docs, a.sinks};
    const auto K0 = head_block(k, s, S, j0, cols, 0, D), V0 = head_block(v, s, S, j0, cols, 0, D);
    for (int64_t r = 0; r < group; ++r)
      gemm_strided_batched(exec, "N", "T", scale, head_block(q, s, S, i0, rows, r, D), group * D,
                           K0, D, 0.0f, head_scores(P, r, rows, cols), group * block, G, in);
    if (bf16) round_bf16(exec, P);
    causal_softmax(exec, P, lse, s * H * S + i0, rows, S, b, true, bf16);
    for (int64_t r = 0; r < group; ++r) {
      const auto gO = head_block(go, s, S, i0, rows, r, D);
      gemm_strided_batched(exec, "T", "N", 1.0f, head_scores(P, r, rows, cols), group * block, gO,
                           group * D, 1.0f, head_block(gv, s, S, j0, cols, 0, D), D, G);
      gemm_strided_batched(exec, "N", "T", 1.0f, gO, group * D, V0, D, 0.0f,
                           head_scores(dP, r, rows, cols), group * block, G);
    }
    softmax_backward(exec, P, o, go, s * S + i0, rows, 0, D, dP, T);
    for (int64_t r = 0; r < group; ++r) {
      const auto dS = head_scores(dP, r, rows, cols);
      gemm_strided_batched(exec, "N", "N", scale, dS, group * block, K0, D, 0.0f,
                           head_block(gq, s, S, i0, rows, r, D), group * D, G);
      gemm_strided_batched(exec, "T", "N", scale, dS, group * block,
                           head_block(q, s, S, i0, rows, r, D), group * D, 1.0f,
                           head_block(gk, s, S, j0, cols, 0, D), D, G);
    }
  });
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
  // (a bfloat16 run's q, k, v and probabilities are bfloat16 values)
  const GemmInputs in = bf16 ? GemmInputs::bfloat16 : GemmInputs::float32;
  if (impl::takes_fused_host_attention(ws, bf16)) {
    exec.fence();
    impl::check_fused_attention(a, {&q, &o}, {&k, &v}, lse, docs);
    ws.reserve_fused(S, D, a.softcap > 0);
    impl::host_fused_attention_forward(a, impl::host_heads(q), impl::host_heads(k),
                                       impl::host_heads(v), impl::host_heads_out(o), lse.data(),
                                       docs.data(), ws.fused.data());
    return;
  }
  ws.reserve(S, a.softcap > 0, a.heads);
  if (ws.batch_heads) {
    impl::attention_forward_all_heads(exec, a, q, k, v, bf16, ws, o, lse, docs);
  } else {
    impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
      const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0;  // keys j0 .. the last
      const Matrix<M> P(ws.scores.data(), rows, cols);
      const impl::SoftmaxRows<M> b{
          s,        i0,        j0,
          a.window, a.softcap, a.softcap > 0 ? Matrix<M>(ws.tanh.data(), rows, cols) : Matrix<M>(),
          docs,     a.sinks,   h};
      gemm(exec, "N", "T", a.scale(), impl::head_block(q, s, S, i0, rows, h, D),
           impl::head_block(k, s, S, j0, cols, g, D), 0.0f, P, in);
      if (bf16) round_bf16(exec, P);
      impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, rows, S, b, false, bf16);
      gemm(exec, "N", "N", 1.0f, P, impl::head_block(v, s, S, j0, cols, g, D), 0.0f,
           impl::head_block(o, s, S, i0, rows, h, D), in);
    });
  }
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
  const GemmInputs in = bf16 ? GemmInputs::bfloat16 : GemmInputs::float32;  // (as the forward)
  Kokkos::deep_copy(exec, gk, 0.0f);  // (summed over query blocks and the heads of a group)
  Kokkos::deep_copy(exec, gv, 0.0f);
  if (impl::takes_fused_host_attention(ws, bf16)) {
    exec.fence();
    impl::check_fused_attention(a, {&q, &o, &go, &gq}, {&k, &v, &gk, &gv}, lse, docs);
    ws.reserve_fused(S, D, a.softcap > 0);
    impl::host_fused_attention_backward(
        a, impl::host_heads(q), impl::host_heads(k), impl::host_heads(v), impl::host_heads(o),
        lse.data(), impl::host_heads(go), impl::host_heads_out(gq), impl::host_heads_out(gk),
        impl::host_heads_out(gv), docs.data(), ws.fused.data());
    return;
  }
  ws.reserve(S, a.softcap > 0, a.heads);
  if (ws.batch_heads) {
    impl::attention_backward_all_heads(exec, a, q, k, v, o, lse, go, bf16, ws, gq, gk, gv, docs);
  } else {
    impl::for_each_block(a, [&](int64_t s, int64_t h, int64_t g, int64_t i0, int64_t rows) {
      const int64_t j0 = a.first_key(s, i0), cols = i0 + rows - j0;
      const auto Q = impl::head_block(q, s, S, i0, rows, h, D);
      const auto K = impl::head_block(k, s, S, j0, cols, g, D);
      const auto V = impl::head_block(v, s, S, j0, cols, g, D);
      const auto gO = impl::head_block(go, s, S, i0, rows, h, D);
      const Matrix<M> P(ws.scores.data(), rows, cols), dP(ws.dscores.data(), rows, cols);
      const Matrix<M> T = a.softcap > 0 ? Matrix<M>(ws.tanh.data(), rows, cols) : Matrix<M>();
      const impl::SoftmaxRows<M> b{s, i0, j0, a.window, a.softcap, T, docs, a.sinks, h};
      gemm(exec, "N", "T", scale, Q, K, 0.0f, P, in);
      if (bf16) round_bf16(exec, P);
      impl::causal_softmax(exec, P, lse, (s * a.heads + h) * S + i0, rows, S, b, true, bf16);
      gemm(exec, "T", "N", 1.0f, P, gO, 1.0f, impl::head_block(gv, s, S, j0, cols, g, D));
      gemm(exec, "N", "T", 1.0f, gO, V, 0.0f, dP);
      impl::softmax_backward(exec, P, o, go, s * S + i0, rows, h, D, dP, T);
      gemm(exec, "N", "N", scale, dP, K, 0.0f, impl::head_block(gq, s, S, i0, rows, h, D));
      gemm(exec, "T", "N", scale, dP, Q, 1.0f, impl::head_block(gk, s, S, j0, cols, g, D));
    });
  }
  if (bf16) {
    round_bf16(exec, gq);
    round_bf16(exec, gk);
    round_bf16(exec, gv);
  }
}

}  // namespace kqlora
