#pragma once
// The LM head fused with the next-token cross-entropy, in chunks so that the [tokens,
// vocab] logits never exist at once. float32 runs go over the vocabulary in chunks with an
// online log-sum-exp (nn/vocab_chunk_cross_entropy.hpp): each of the two products reads
// the head once a pass of up to 2048 tokens, with all of them as its rows (on the 135M
// shape's 49152 x 576 head at 1024 tokens, one thread, Xeon model 167: the two products
// 12% faster than over chunks of 256 tokens, and a chunk's logits 4 MiB instead of 48;
// docs/BENCHMARKS.md, "The LM head over vocabulary chunks").
// bfloat16 runs round each logit's gradient before its product, which needs the final
// log-sum-exp, so they go over the tokens in chunks; for each chunk of tokens,
//   logits = h W^T                    (W the frozen dense head [vocab, hidden]; float32,
//                                      rounded to bfloat16 first when `bf16`, as the
//                                      model's logits are before the loss upcasts them)
//   logits = logits / d               (a logits divisor d, Granite's logits_scaling: rounded
//                                      in bfloat16, d unrounded)
//   logits = c tanh(logits / c)       (a final-logit soft-cap c, Gemma 2: in the logits'
//                                      dtype, each operation rounded in bfloat16)
//   loss  += sum_t [logsumexp(logits_t) - logits_t[label]]   over the chunk's scored tokens
//   gh     = dlogits W,  dlogits = (softmax(logits) - onehot(label)) / normaliser
//                                      (times 1 - tanh^2 under a soft-cap; over d, rounded
//                                      again, under a divisor)
// (float32 runs fold a divisor into the products: alpha = 1/d, within an ulp of l / d)
// The label shift is Hugging Face's: labels[s, p] is the token at position p, so the
// logits at p are scored against labels[s, p + 1]; the last position and label -100 are
// not scored. The result is the summed loss divided by `normaliser` (the global count of
// scored tokens: the same at any world size and micro-batching).
// A float32 call with gradients whose caller gives h up as scratch (HiddenAfter::scratch:
// the decoder's final norm output, read by nothing else) runs the head over the scored
// tokens only: their rows gathered into gh, the two products over those, their gradient
// scattered back (zero rows for the rest). Fine-tuning data whose prompts are masked
// (docs/FINETUNING.md) skips the prompts' share of the head, about a fifth of a 135M step;
// PyTorch computes every position's logits.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"
#include "kqlora/nn/vocab_chunk_cross_entropy.hpp"

namespace kqlora {

/// What lm_head_cross_entropy may do with its hidden states h: leave them, or overwrite
/// them (a float32 call with gradients then computes the scored tokens' logits only).
enum class HiddenAfter { kept, scratch };

template <class M>
struct CrossEntropyWorkspace {
  Kokkos::View<float*, M> logits;     // a chunk's: [chunk, vocab] or [pass, vocab chunk]
  Kokkos::View<double*, M> row_loss;  // [tokens]
  VocabChunkRows<M> rows;             // (vocabulary chunks) [pass]
  // (HiddenAfter::scratch) the token of each scored row, the row of each token (-1: none)
  Kokkos::View<int32_t*, M> token_of, row_of;
  bool gathered = false;  // the last call's row_loss rows were token_of's (else row t: token t)
  /// Token chunks (bfloat16 runs): at most this many bytes of logits, and at most
  /// kMaxChunkTokens tokens, per chunk: the head W is read once per chunk by each product, so the
  /// products run faster with more tokens a chunk (oneDNN on an AVX-512 Xeon, a 49152 x 576 head:
  /// 116 and 154 GFLOP/s at 85 tokens, 145 and 163 at 256, 148 and 167 at 512; docs/BENCHMARKS.md),
  /// while the softmax's passes over a chunk's logits are a small share either way. On a GPU the
  /// chunk is larger (512 MiB, 4096 tokens): its products need thousands of rows to fill
  /// the device, and a chunk's logits are not sized for a CPU's cache there.
  static constexpr bool kHost = std::is_same<M, Kokkos::HostSpace>::value;
  int64_t chunk_bytes = kHost ? int64_t(64) << 20 : int64_t(512) << 20;
  static constexpr int64_t kMaxChunkTokens = kHost ? 256 : 4096;

  /// Vocabulary chunks: tokens per pass over the head, and vocabulary entries per chunk. The
  /// chunking of the vocabulary does not depend on the token count (each token's sum over
  /// the chunks runs in the same order at any world size and micro-batch). On the host a
  /// chunk's logits (4 MiB at 1024 tokens, 8 MiB at a full pass) stay in cache between
  /// their two products; chunks of 512 - 2048 entries ran within a few percent of each
  /// other at 256 and 1024 tokens (docs/BENCHMARKS.md).
  int64_t pass_tokens = kHost ? 2048 : 4096;
  int64_t vocab_chunk = kHost ? 1024 : 16384;

  /// Whether a call goes over vocabulary chunks: float32 runs (see the top of this file).
  static bool by_vocab_chunks(bool bf16) { return !bf16; }

  /// A call's chunks: tokens per chunk (a pass over the head), vocabulary entries per chunk.
  struct Chunking {
    int64_t tokens, vocab;
  };
  Chunking chunking(int64_t tokens, int64_t vocab, bool bf16) const {
    if (!by_vocab_chunks(bf16))
      return {std::max<int64_t>(1, std::min({tokens, kMaxChunkTokens, chunk_bytes / (4 * vocab)})),
              vocab};
    return {std::max<int64_t>(1, std::min(tokens, pass_tokens)),
            std::max<int64_t>(1, std::min(vocab, vocab_chunk))};
  }

  /// The floats of the workspace a call over `tokens` holds (the memory estimate).
  int64_t floats(int64_t tokens, int64_t vocab, bool bf16) const {
    const Chunking c = chunking(tokens, vocab, bf16);
    if (!by_vocab_chunks(bf16)) return c.tokens * c.vocab;
    return c.tokens * (c.vocab + VocabChunkRows<M>::kFloatsPerToken) + 2 * tokens;  // (+ rows)
  }

  /// A bfloat16 head's 16-bit copy for the host's bfloat16 products (host_bf16_products()),
  /// made from the head at `head16_of` (frozen: made once).
  Kokkos::View<uint16_t*, M> head16;
  const float* head16_of = nullptr;

  /// The buffers of a call grown to hold `logit_floats` and `tokens` losses.
  void reserve(int64_t logit_floats, int64_t tokens) {
    if (static_cast<int64_t>(logits.extent(0)) < logit_floats) {
      logits = Kokkos::View<float*, M>();  // (the old one goes first)
      logits = Kokkos::View<float*, M>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::logits"),
          logit_floats);
    }
    if (static_cast<int64_t>(row_loss.extent(0)) < tokens)
      row_loss = Kokkos::View<double*, M>("kqlora::cross_entropy::row_loss", tokens);
  }
  /// token_of and row_of grown to `tokens`.
  void reserve_rows(int64_t tokens) {
    auto grow = [&](Kokkos::View<int32_t*, M>& v, const char* label) {
      if (static_cast<int64_t>(v.extent(0)) < tokens)
        v = Kokkos::View<int32_t*, M>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), tokens);
    };
    grow(token_of, "kqlora::cross_entropy::token_of");
    grow(row_of, "kqlora::cross_entropy::row_of");
  }
};

/// What the model does to its logits before the loss: a divisor (Granite) or a soft-cap
/// (Gemma 2), either or none (0).
struct FinalLogits {
  float divisor = 0.0f, softcap = 0.0f;

  /// A logit as the model outputs it, from the head's product (rounded first when `bf16`).
  KOKKOS_INLINE_FUNCTION float apply(float x, bool bf16) const {
    if (divisor > 0.0f) x = bf16 ? round_to_bf16(x / divisor) : x / divisor;
    if (softcap > 0.0f) x = soft_cap(x, softcap, bf16);
    return x;
  }
};

namespace impl {

/// The cross-entropy of one chunk's logits lg [n, vocab] (tokens t0 .. t0 + n - 1): each
/// row's loss into row_loss(t), and with `grad` its gradient in place of its logits.
/// `fl`: the logits are divided or soft-capped first.
template <class ExecSpace, class M, class L>
void cross_entropy_rows(const ExecSpace& exec, const L& lg, const TokenMatrix<M>& labels,
                        int64_t t0, float inv, bool bf16, bool grad,
                        const Kokkos::View<double*, M>& row_loss, FinalLogits fl = {}) {
  const float cap = fl.softcap, div = fl.divisor;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t V = lg.extent(1), S = labels.extent(1);
  Kokkos::parallel_for(
      "kqlora::cross_entropy",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(lg.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t r = team.league_rank(), t = t0 + r, p = t % S;
        const int32_t label = p + 1 < S ? labels(t / S, p + 1) : kIgnoreLabel;
        float* x = &lg(r, 0);
        if (label == kIgnoreLabel) {
          Kokkos::single(Kokkos::PerTeam(team), [&] { row_loss(t) = 0.0; });
          if (grad) row_fill(team, x, 0, V, 0.0f);
          return;
        }
        row_for(team, 0, V,
                [&](int64_t v) { x[v] = fl.apply(bf16 ? round_to_bf16(x[v]) : x[v], bf16); });
        team.team_barrier();
        const float m = row_max(team, x, 0, V);
        const float target = x[label];
        team.team_barrier();  // (everyone has read x[label] before it changes)
        // One exp per logit, kept in place (the chunk's logits are scratch) for the gradient;
        // under a soft-cap the capped logit is kept instead: the cap's derivative needs it.
        float z = 0.0f;
        if (cap > 0.0f) {
          z = row_sum(team, 0, V, [&](int64_t v) { return fast_exp(x[v] - m); });
        } else {
          row_exp(team, x, 0, V, m);
          team.team_barrier();
          z = row_sum(team, x, 0, V);
        }
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          row_loss(t) = static_cast<double>(logf(z)) + static_cast<double>(m) - target;
        });
        if (!grad) return;
        const float scale = inv / z;
        if (cap > 0.0f) {
          team.team_barrier();
          row_for(team, 0, V, [&](int64_t v) {
            const float s = x[v], th = s / cap;  // (tanh of the capped logit)
            const float d =
                (fast_exp(s - m) * scale - (v == label ? inv : 0.0f)) * (1.0f - th * th);
            x[v] = bf16 ? round_to_bf16(d) : d;
          });
          return;
        }
        // softmax - onehot(label), over the normaliser: every exp scaled, the label's then
        // set from its own (unscaled) exp.
        const float d_label = x[label] * scale - inv;
        team.team_barrier();
        row_scale(team, x, 0, V, scale);
        team.team_barrier();
        Kokkos::single(Kokkos::PerTeam(team), [&] { x[label] = d_label; });
        if (bf16 || div > 0.0f) {  // (the divisor's backward: over d, rounded again)
          team.team_barrier();
          row_for(team, 0, V, [&](int64_t v) {
            float d = bf16 ? round_to_bf16(x[v]) : x[v];
            if (div > 0.0f) d = bf16 ? round_to_bf16(d / div) : d / div;
            x[v] = d;
          });
        }
      });
}

/// Whether the head's products run on bfloat16 hardware (bfloat16 values on a host with
/// host_bf16_products()); then ws.head16 holds the head's 16-bit copy, made once: the
/// head is frozen, and converting it for each chunk's two products would move more bytes
/// than the products.
template <class ExecSpace, class M>
bool head_on_bf16_unit(const ExecSpace& exec, const Matrix<M>& W, GemmInputs head_inputs,
                       CrossEntropyWorkspace<M>& ws) {
  bool bf16_unit = false;
  if constexpr (CrossEntropyWorkspace<M>::kHost)
    bf16_unit = head_inputs == GemmInputs::bfloat16 && host_bf16_products();
  if (bf16_unit && ws.head16_of != W.data()) {
    KQLORA_CHECK(W.span_is_contiguous(), "lm_head_cross_entropy: a head with gaps");
    ws.head16 = Kokkos::View<uint16_t*, M>();
    ws.head16 = Kokkos::View<uint16_t*, M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::head16"), W.size());
    const auto w16 = ws.head16;
    const float* w = W.data();
    Kokkos::parallel_for(
        "kqlora::cross_entropy::head16",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, W.size()),
        KOKKOS_LAMBDA(int64_t i) { w16(i) = bfloat16::round_bits(w[i]); });
    ws.head16_of = W.data();
  }
  return bf16_unit;
}

/// lg = h W^T: over the head's 16-bit copy when `bf16_unit` (head_on_bf16_unit), else through gemm.
template <class ExecSpace, class M, class H, class L>
void head_logits(const ExecSpace& exec, const H& h, const Matrix<M>& W, bool bf16_unit,
                 const CrossEntropyWorkspace<M>& ws, GemmInputs head_inputs, const L& lg) {
  if (bf16_unit)
    gemm_bf16_weight("N", "T", 1.0f, h, ws.head16.data(), W.extent(0), W.extent(1), W.extent(1),
                     0.0f, lg);
  else
    gemm(exec, "N", "T", 1.0f, h, W, 0.0f, lg, head_inputs);
}

}  // namespace impl

namespace impl {

/// The float32 call: passes of tokens over vocabulary chunks (vocab_chunk_cross_entropy.hpp).
template <class ExecSpace, class M>
void lm_head_cross_entropy_vocab_chunks(const ExecSpace& exec, const Matrix<M>& h,
                                        const Matrix<M>& W, const RowLabels<M>& labels, float inv,
                                        const Matrix<M>& gh, CrossEntropyWorkspace<M>& ws,
                                        FinalLogits fl) {
  const int64_t T = h.extent(0), V = W.extent(0);
  // (a divisor d: the logits' product times 1/d, and the gradient's, through inv)
  const float alpha = fl.divisor > 0.0f ? 1.0f / fl.divisor : 1.0f;
  inv *= alpha;
  const bool grad = gh.data() != nullptr;
  const auto [pass, chunk] = ws.chunking(T, V, false);
  ws.reserve(pass * chunk, T);
  if (ws.rows.capacity() < pass) {
    ws.rows = VocabChunkRows<M>();
    ws.rows = VocabChunkRows<M>(pass);
  }
  for (int64_t t0 = 0; t0 < T; t0 += pass) {
    const int64_t n = std::min(pass, T - t0);
    const auto tokens = Kokkos::make_pair(t0, t0 + n);
    const auto hs = Kokkos::subview(h, tokens, Kokkos::ALL);
    Matrix<M> g;
    if (grad) g = Kokkos::subview(gh, tokens, Kokkos::ALL);
    vocab_chunk_start(exec, ws.rows, n);
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
      const int64_t vc = std::min(chunk, V - v0);
      const Matrix<M> lg(ws.logits.data(), n, vc);
      const auto Wc = Kokkos::subview(W, Kokkos::make_pair(v0, v0 + vc), Kokkos::ALL);
      gemm(exec, "N", "T", alpha, hs, Wc, 0.0f, lg);
      vocab_chunk_softmax(exec, lg, labels, t0, v0, fl.softcap, grad, ws.rows);
      if (!grad) continue;
      if (v0 > 0) vocab_chunk_rescale(exec, ws.rows, g);
      gemm(exec, "N", "N", 1.0f, lg, Wc, v0 > 0 ? 1.0f : 0.0f, g);
    }
    vocab_chunk_finish(exec, labels, t0, n, inv, W, ws.rows, ws.row_loss, g);
  }
}

/// ws.token_of and ws.row_of for the first T tokens of `labels`; returns how many are scored.
template <class ExecSpace, class M>
int64_t scored_rows(const ExecSpace& exec, const TokenMatrix<M>& labels, int64_t T,
                    CrossEntropyWorkspace<M>& ws) {
  KQLORA_CHECK(T <= INT32_MAX, "lm_head_cross_entropy: over 2^31 tokens in one call");
  ws.reserve_rows(T);
  const auto token_of = ws.token_of, row_of = ws.row_of;
  int64_t n = 0;
  Kokkos::parallel_scan(
      "kqlora::cross_entropy::scored_rows",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, T),
      KOKKOS_LAMBDA(int64_t t, int64_t & before, bool final) {
        const bool scored = next_token_label(labels, t) != kIgnoreLabel;
        if (final) {
          row_of(t) = scored ? static_cast<int32_t>(before) : -1;
          if (scored) token_of(before) = static_cast<int32_t>(t);
        }
        if (scored) before += 1;
      },
      n);
  return n;
}

/// dst's first n rows = src's rows token_of(0 .. n).
template <class ExecSpace, class M>
void gather_rows(const ExecSpace& exec, const Matrix<M>& src,
                 const Kokkos::View<int32_t*, M>& token_of, int64_t n, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::cross_entropy::gather_rows", over(exec, n, src.extent(1)),
      KOKKOS_LAMBDA(int64_t r, int64_t f) { dst(r, f) = src(token_of(r), f); });
}

/// dst's row t = src's row row_of(t), or zeros where row_of(t) < 0.
template <class ExecSpace, class M>
void scatter_rows(const ExecSpace& exec, const Matrix<M>& src,
                  const Kokkos::View<int32_t*, M>& row_of, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::cross_entropy::scatter_rows", over(exec, dst.extent(0), dst.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const int32_t r = row_of(t);
        dst(t, f) = r >= 0 ? src(r, f) : 0.0f;
      });
}

}  // namespace impl

/// Returns the loss sum / normaliser; with `gh` non-empty ([tokens, hidden]) writes the
/// gradient of that into it. `fl`: a logits divisor or soft-cap. `head_inputs` =
/// bfloat16: h and W hold bfloat16 values (with `bf16`, the logits' gradient is rounded
/// too), core/blas.hpp. `hidden`: whether h may be overwritten (the top of this file).
/// `gather` ([tokens, hidden], float32 runs without gradients): a buffer the scored
/// tokens' rows are gathered into, so the head runs over them alone -- as a call with
/// gradients does, the same sums: a sequence's log-probability is bit for bit the one a
/// training forward gives (a preference objective's reference against its policy).
template <class ExecSpace, class M>
double lm_head_cross_entropy(const ExecSpace& exec, const Matrix<M>& h, const Matrix<M>& W,
                             const TokenMatrix<M>& labels, double normaliser, bool bf16,
                             const Matrix<M>& gh, CrossEntropyWorkspace<M>& ws, FinalLogits fl = {},
                             GemmInputs head_inputs = GemmInputs::float32,
                             HiddenAfter hidden = HiddenAfter::kept,
                             const Matrix<M>& gather = Matrix<M>()) {
  const int64_t T = h.extent(0), V = W.extent(0), H = W.extent(1);
  const bool grad = gh.data() != nullptr;
  const float inv = static_cast<float>(1.0 / normaliser);
  int64_t rows = T;  // (the rows whose losses are summed)
  ws.gathered = false;
  if (CrossEntropyWorkspace<M>::by_vocab_chunks(bf16)) {
    const bool gathered = hidden == HiddenAfter::scratch && (grad || gather.data());
    const int64_t scored = gathered ? impl::scored_rows(exec, labels, T, ws) : T;
    if (scored < T && !grad) {  // the scored rows into `gather`, their losses alone
      rows = scored;
      ws.gathered = true;
      const Matrix<M> hs =
          Kokkos::subview(gather, Kokkos::make_pair(int64_t(0), scored), Kokkos::ALL);
      impl::gather_rows(exec, h, ws.token_of, scored, hs);
      impl::lm_head_cross_entropy_vocab_chunks(exec, hs, W, RowLabels<M>(labels, ws.token_of), inv,
                                               Matrix<M>(), ws, fl);
    } else if (scored < T) {  // the scored rows into gh, their gradient into h, then back to gh
      rows = scored;
      ws.gathered = true;
      const auto first = Kokkos::make_pair(int64_t(0), scored);
      const Matrix<M> hs = Kokkos::subview(gh, first, Kokkos::ALL);
      const Matrix<M> gs = Kokkos::subview(h, first, Kokkos::ALL);
      impl::gather_rows(exec, h, ws.token_of, scored, hs);
      impl::lm_head_cross_entropy_vocab_chunks(exec, hs, W, RowLabels<M>(labels, ws.token_of), inv,
                                               gs, ws, fl);
      impl::scatter_rows(exec, gs, ws.row_of, gh);
    } else {
      impl::lm_head_cross_entropy_vocab_chunks(exec, h, W, RowLabels<M>(labels), inv, gh, ws, fl);
    }
  } else {
    const int64_t chunk = ws.chunking(T, V, true).tokens;
    ws.reserve(chunk * V, T);
    const bool bf16_unit = impl::head_on_bf16_unit(exec, W, head_inputs, ws);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      const auto rows = Kokkos::make_pair(t0, t0 + n);
      const Matrix<M> lg(ws.logits.data(), n, V);
      impl::head_logits(exec, Kokkos::subview(h, rows, Kokkos::ALL), W, bf16_unit, ws, head_inputs,
                        lg);
      impl::cross_entropy_rows(exec, lg, labels, t0, inv, bf16, grad, ws.row_loss, fl);
      if (!grad) continue;
      const auto g = Kokkos::subview(gh, rows, Kokkos::ALL);
      if (bf16_unit)
        gemm_bf16_weight("N", "N", 1.0f, lg, ws.head16.data(), V, H, H, 0.0f, g);
      else
        gemm(exec, "N", "N", 1.0f, lg, W, 0.0f, g, head_inputs);
      if (bf16)
        Kokkos::parallel_for(
            "kqlora::cross_entropy::round_grad", over(exec, n, g.extent(1)),
            KOKKOS_LAMBDA(int64_t i, int64_t f) { g(i, f) = round_to_bf16(g(i, f)); });
    }
  }
  const auto losses = ws.row_loss;
  double sum = 0;
  Kokkos::parallel_reduce(
      "kqlora::cross_entropy::sum",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, rows),
      KOKKOS_LAMBDA(int64_t t, double& acc) { acc += losses(t); }, sum);
  return sum / normaliser;
}

/// The last call's token losses (-log p of each scored token's label) summed per sequence
/// of S tokens into out [T / S] (sums in double, each sequence's in token order), and the
/// scored tokens of each into count. With prefix_end [T / S]: the labels at positions
/// below prefix_end(s) into prefix [T / S] instead (not counted).
template <class ExecSpace, class M>
void sequence_losses(const ExecSpace& exec, const CrossEntropyWorkspace<M>& ws,
                     const TokenMatrix<M>& labels, const Kokkos::View<double*, M>& out,
                     const Kokkos::View<int64_t*, M>& count,
                     const Kokkos::View<int64_t*, M>& prefix_end = {},
                     const Kokkos::View<double*, M>& prefix = {}) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t S = labels.extent(1);
  const auto losses = ws.row_loss;
  const auto row_of = ws.row_of;
  const bool gathered = ws.gathered;
  Kokkos::parallel_for(
      "kqlora::cross_entropy::sequence_losses",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(labels.extent(0)), 1),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t s = team.league_rank();
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          double sum = 0, before = 0;
          int64_t n = 0;
          const int64_t end = prefix_end.data() ? prefix_end(s) : 0;
          for (int64_t t = s * S; t < (s + 1) * S; ++t) {
            if (impl::next_token_label(labels, t) == kIgnoreLabel) continue;
            const double v = gathered ? losses(row_of(t)) : losses(t);
            if (t % S + 1 < end) {  // (its label's position)
              before += v;
              continue;
            }
            sum += v;
            n += 1;
          }
          out(s) = sum;
          count(s) = n;
          if (prefix.data()) prefix(s) = before;
        });
      });
}

}  // namespace kqlora
