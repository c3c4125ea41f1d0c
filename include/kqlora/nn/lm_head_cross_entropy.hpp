#pragma once
// The LM head fused with the next-token cross-entropy, chunked over tokens so that the
// [tokens, vocab] logits never exist at once: for each chunk of tokens,
//   logits = h W^T                    (W the frozen dense head [vocab, hidden]; float32,
//                                      rounded to bfloat16 first when `bf16`, as the
//                                      model's logits are before the loss upcasts them)
//   logits = c tanh(logits / c)       (a final-logit soft-cap c, Gemma 2: in the logits'
//                                      dtype, each operation rounded in bfloat16)
//   loss  += sum_t [logsumexp(logits_t) - logits_t[label]]   over the chunk's scored tokens
//   gh     = dlogits W,  dlogits = (softmax(logits) - onehot(label)) / normaliser
//                                      (times 1 - tanh^2 under a soft-cap)
// The label shift is Hugging Face's: labels[s, p] is the token at position p, so the
// logits at p are scored against labels[s, p + 1]; the last position and label -100 are
// not scored. The result is the summed loss divided by `normaliser` (the global count of
// scored tokens: the same at any world size and micro-batching).

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

template <class M>
struct CrossEntropyWorkspace {
  Matrix<M> logits;                   // [chunk, vocab]
  Kokkos::View<double*, M> row_loss;  // [tokens]
  /// At most this many bytes of logits, and at most kMaxChunkTokens tokens, per chunk: the
  /// head W is read once per chunk by each product, so the products run faster with more
  /// tokens a chunk (oneDNN on an AVX-512 Xeon, a 49152 x 576 head: 116 and 154 GFLOP/s at
  /// 85 tokens, 145 and 163 at 256, 148 and 167 at 512; docs/BENCHMARKS.md), while the
  /// softmax's passes over a chunk's logits are a small share either way. On a GPU the
  /// chunk is larger (512 MiB, 4096 tokens): its products need thousands of rows to fill
  /// the device, and a chunk's logits are not sized for a CPU's cache there.
  static constexpr bool kHost = std::is_same<M, Kokkos::HostSpace>::value;
  int64_t chunk_bytes = kHost ? int64_t(64) << 20 : int64_t(512) << 20;
  static constexpr int64_t kMaxChunkTokens = kHost ? 256 : 4096;

  /// Tokens per chunk for a call over `tokens` (the memory estimate uses it too).
  int64_t chunk_tokens(int64_t tokens, int64_t vocab) const {
    return std::max<int64_t>(1, std::min({tokens, kMaxChunkTokens, chunk_bytes / (4 * vocab)}));
  }

  /// A bfloat16 head's 16-bit copy for the host's AMX products (host_bf16_products()),
  /// made from the head at `head16_of` (frozen: made once).
  Kokkos::View<uint16_t*, M> head16;
  const float* head16_of = nullptr;

  int64_t reserve(int64_t tokens, int64_t vocab) {
    const int64_t chunk = chunk_tokens(tokens, vocab);
    if (static_cast<int64_t>(logits.extent(0)) < chunk ||
        static_cast<int64_t>(logits.extent(1)) != vocab)
      logits = Matrix<M>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::cross_entropy::logits"), chunk,
          vocab);
    if (static_cast<int64_t>(row_loss.extent(0)) < tokens)
      row_loss = Kokkos::View<double*, M>("kqlora::cross_entropy::row_loss", tokens);
    return chunk;
  }
};

namespace impl {

/// The cross-entropy of one chunk's logits lg [n, vocab] (tokens t0 .. t0 + n - 1): each
/// row's loss into row_loss(t), and with `grad` its gradient in place of its logits.
/// `cap` > 0: the logits are soft-capped first.
template <class ExecSpace, class M, class L>
void cross_entropy_rows(const ExecSpace& exec, const L& lg, const TokenMatrix<M>& labels,
                        int64_t t0, float inv, bool bf16, bool grad,
                        const Kokkos::View<double*, M>& row_loss, float cap = 0.0f) {
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
        if (bf16) row_for(team, 0, V, [&](int64_t v) { x[v] = round_to_bf16(x[v]); });
        if (cap > 0.0f) {
          team.team_barrier();
          row_for(team, 0, V, [&](int64_t v) { x[v] = soft_cap(x[v], cap, bf16); });
        }
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
        if (bf16) {
          team.team_barrier();
          row_for(team, 0, V, [&](int64_t v) { x[v] = round_to_bf16(x[v]); });
        }
      });
}

/// Whether the head's products run on AMX (bfloat16 values on a host with
/// host_bf16_products()); then ws.head16 holds the head's 16-bit copy, made once: the
/// head is frozen, and converting it for each chunk's two products would move more bytes
/// than the products.
template <class ExecSpace, class M>
bool head_on_amx(const ExecSpace& exec, const Matrix<M>& W, GemmInputs head_inputs,
                 CrossEntropyWorkspace<M>& ws) {
  bool amx = false;
  if constexpr (CrossEntropyWorkspace<M>::kHost)
    amx = head_inputs == GemmInputs::bfloat16 && host_bf16_products();
  if (amx && ws.head16_of != W.data()) {
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
  return amx;
}

/// lg = h W^T: over the head's 16-bit copy when `amx` (head_on_amx), else through gemm.
template <class ExecSpace, class M, class H, class L>
void head_logits(const ExecSpace& exec, const H& h, const Matrix<M>& W, bool amx,
                 const CrossEntropyWorkspace<M>& ws, GemmInputs head_inputs, const L& lg) {
  if (amx)
    gemm_bf16_weight("N", "T", 1.0f, h, ws.head16.data(), W.extent(0), W.extent(1), W.extent(1),
                     0.0f, lg);
  else
    gemm(exec, "N", "T", 1.0f, h, W, 0.0f, lg, head_inputs);
}

}  // namespace impl

/// Returns the loss sum / normaliser; with `gh` non-empty ([tokens, hidden]) writes the
/// gradient of that into it. `softcap` > 0: the final-logit soft-cap. `head_inputs` =
/// bfloat16: h and W hold bfloat16 values (with `bf16`, the logits' gradient is rounded
/// too), core/blas.hpp.
template <class ExecSpace, class M>
double lm_head_cross_entropy(const ExecSpace& exec, const Matrix<M>& h, const Matrix<M>& W,
                             const TokenMatrix<M>& labels, double normaliser, bool bf16,
                             const Matrix<M>& gh, CrossEntropyWorkspace<M>& ws,
                             float softcap = 0.0f, GemmInputs head_inputs = GemmInputs::float32) {
  const int64_t T = h.extent(0), V = W.extent(0);
  const bool grad = gh.data() != nullptr;
  const int64_t chunk = ws.reserve(T, V);
  const float inv = static_cast<float>(1.0 / normaliser);
  const auto row_loss = ws.row_loss;
  const bool amx = impl::head_on_amx(exec, W, head_inputs, ws);
  const int64_t H = W.extent(1);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const auto rows = Kokkos::make_pair(t0, t0 + n);
    const auto lg = Kokkos::subview(ws.logits, Kokkos::make_pair(int64_t(0), n), Kokkos::ALL);
    impl::head_logits(exec, Kokkos::subview(h, rows, Kokkos::ALL), W, amx, ws, head_inputs, lg);
    impl::cross_entropy_rows(exec, lg, labels, t0, inv, bf16, grad, row_loss, softcap);
    if (grad) {
      const auto g = Kokkos::subview(gh, rows, Kokkos::ALL);
      if (amx)
        gemm_bf16_weight("N", "N", 1.0f, lg, ws.head16.data(), V, H, H, 0.0f, g);
      else
        gemm(exec, "N", "N", 1.0f, lg, W, 0.0f, g, head_inputs);
      if (bf16)
        Kokkos::parallel_for(
            "kqlora::cross_entropy::round_grad", over(exec, n, g.extent(1)),
            KOKKOS_LAMBDA(int64_t i, int64_t f) { g(i, f) = round_to_bf16(g(i, f)); });
    }
  }
  double sum = 0;
  Kokkos::parallel_reduce(
      "kqlora::cross_entropy::sum",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, T),
      KOKKOS_LAMBDA(int64_t t, double& acc) { acc += row_loss(t); }, sum);
  return sum / normaliser;
}

}  // namespace kqlora
