#pragma once
// A sparse MLP (docs/MODELS.md, "Experts"): a frozen router picks k of E experts per token
// and weighs them, each expert is a gated MLP over NF4 weights, and the token's output is
// the weighted sum of its experts' outputs -- transformers' MoE blocks (Qwen3-MoE, Mixtral,
// OLMoE), no token dropped:
//   logits = x R^T                       [T, E], the router's (frozen, dense) products
//   softmax_topk: p = softmax(logits) in float32, chosen = the k largest p (ties to the
//                 lower expert, as torch.topk), w = p[chosen] (/ their sum when norm_topk)
//   topk_softmax: chosen = the k largest logits, w = softmax over them
// (gpt-oss: logits = x R^T + b, its experts' products with biases and their activation
// the clamped SwiGLU, nn/clamped_swiglu.hpp)
//   y_t = sum over j of w_tj * down_e(act(gate_e(x_t)) * up_e(x_t)),  e = chosen_tj
// The (token, j) slots are grouped by expert (counts, offsets and an order of the slots,
// expert by expert and token by token), the inputs gathered into that order, each
// expert's three products run on its contiguous rows, and the outputs combined per token
// in ascending expert order, as transformers' index_add_ over the experts it hits.
//
// The backward flows through the experts into their input and through the routing weights
// into the router's logits and so into its input (the router itself is frozen).
//
// The grouping is made on the host: a device run copies the chosen experts there per
// layer (a synchronisation of the model's stream). The experts' products then loop over
// the experts with rows (the host: each a call of the fused NF4 kernel), or run grouped,
// one launch a projection for all of them (a device; nn/sparse_mlp_grouped.hpp).

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/nn/batch.hpp"
#include "kqlora/nn/clamped_swiglu.hpp"
#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/gated_mlp.hpp"
#include "kqlora/nn/lora_projection.hpp"
#include "kqlora/nn/sparse_mlp_grouped.hpp"

namespace kqlora {

template <class M>
using IndexMatrix = Kokkos::View<int32_t**, Kokkos::LayoutRight, M>;

/// One sparse layer's values the backward reads (views of its block buffers) and the
/// grouping (offsets on the host).
template <class M>
struct SparseMlpCache {
  Matrix<M> logits;                 // [T, E]
  Matrix<M> weight;                 // [T, k] routing weights
  IndexMatrix<M> chosen;            // [T, k] experts
  IndexMatrix<M> where;             // [T, k] each slot's row in the grouped order
  IndexMatrix<M> order;             // [T * k, 1] the slot (t * k + j) of each grouped row
  Matrix<M> xg, gate, up, act, yg;  // [T * k, H | I | I | I | H], grouped rows
  Matrix<M> h_gate_up, h_down;      // [T * k, rank]: the expert adapters' x A^T
  std::vector<int64_t> offsets;     // E + 1: expert e's rows are [offsets[e], offsets[e + 1])
};

/// The backward's scratch ([T * k, width] and [T, k] views of shared buffers).
template <class M>
struct SparseMlpScratch {
  Matrix<M> gyg, gxg, gact, ggate, gup;  // grouped rows
  Matrix<M> gw, glogits;                 // [T, k], [T, E]
};

/// Expert e's three NF4 weights and, where the experts are LoRA targets, its adapters as
/// PEFT's target_parameters puts them on the fused parameters: one on gate_up (gate and up
/// share its A) and one on down (docs/MODELS.md, "Experts").
template <class M>
struct ExpertWeights {
  const Nf4Tensor<M>*gate = nullptr, *up = nullptr, *down = nullptr;
  bool gate_up_lora = false, down_lora = false;
  LoraAdapterViews<M> gate_ad, up_ad, down_ad;                  // (gate's and up's a and ga alike)
  Kokkos::View<const float*, M> gate_bias, up_bias, down_bias;  // (gpt-oss; empty: none)
};

/// The router: its frozen weight [E, H] and bias [E] (gpt-oss; empty: none).
template <class M>
struct RouterWeights {
  Matrix<M> weight;
  Kokkos::View<const float*, M> bias;
  // Gemma 4: each chosen expert's weight, after the renormalisation, times its entry [E]
  Kokkos::View<const float*, M> per_expert_scale;
};

namespace impl {

/// Rows [a, b) of a row-major matrix with contiguous rows.
template <class M>
Matrix<M> row_block(const Matrix<M>& m, int64_t a, int64_t b) {
  return Matrix<M>(m.data() + a * static_cast<int64_t>(m.stride(0)), b - a, m.extent(1));
}

/// The k experts of each token and their weights (see the header).
template <class ExecSpace, class M>
void route(const ExecSpace& exec, const ExpertsSpec& spec, bool bf16, const Matrix<M>& logits,
           const IndexMatrix<M>& chosen, const Matrix<M>& weight,
           const Kokkos::View<const float*, M>& per_expert_scale = {}) {
  const bool scaled = per_expert_scale.data() != nullptr;
  const int64_t E = logits.extent(1), K = chosen.extent(1);
  const bool norm = spec.norm_topk, softmax_first = spec.router == RouterKind::softmax_topk;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::route",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        float mx = logits(t, 0);
        for (int64_t e = 1; e < E; ++e) mx = logits(t, e) > mx ? logits(t, e) : mx;
        float sum = 0;
        if (softmax_first)
          for (int64_t e = 0; e < E; ++e) sum += fast_exp(logits(t, e) - mx);
        // The k largest (probabilities and logits order alike), ties to the lower index.
        float wsum = 0;
        for (int64_t j = 0; j < K; ++j) {
          int32_t best = -1;
          for (int64_t e = 0; e < E; ++e) {
            bool taken = false;
            for (int64_t i = 0; i < j; ++i) taken = taken || chosen(t, i) == e;
            if (!taken && (best < 0 || logits(t, e) > logits(t, best)))
              best = static_cast<int32_t>(e);
          }
          chosen(t, j) = best;
          const float v = softmax_first ? fast_exp(logits(t, best) - mx) / sum
                                        : fast_exp(logits(t, best) - logits(t, chosen(t, 0)));
          weight(t, j) = v;
          wsum += v;
        }
        if (!softmax_first || norm)
          for (int64_t j = 0; j < K; ++j) weight(t, j) /= wsum;
        if (scaled)
          for (int64_t j = 0; j < K; ++j) weight(t, j) *= per_expert_scale(chosen(t, j));
        if (bf16)  // (transformers casts the weights to the activations' dtype)
          for (int64_t j = 0; j < K; ++j) weight(t, j) = round_to_bf16(weight(t, j));
      });
}

/// offsets, order and where from the chosen experts (on the host; see the header).
template <class ExecSpace, class M>
void group_by_expert(const ExecSpace& exec, int64_t E, SparseMlpCache<M>& c) {
  const int64_t T = c.chosen.extent(0), K = c.chosen.extent(1);
  auto chosen = Kokkos::create_mirror_view(Kokkos::HostSpace(), c.chosen);
  Kokkos::deep_copy(exec, chosen, c.chosen);
  fence(exec, "kqlora::sparse_mlp::chosen");  // (read on the host below)
  c.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) ++c.offsets[static_cast<size_t>(chosen(t, j) + 1)];
  for (int64_t e = 0; e < E; ++e) c.offsets[e + 1] += c.offsets[e];
  auto order = Kokkos::create_mirror_view(Kokkos::HostSpace(), c.order);
  auto where = Kokkos::create_mirror_view(Kokkos::HostSpace(), c.where);
  std::vector<int64_t> next(c.offsets.begin(), c.offsets.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = next[static_cast<size_t>(chosen(t, j))]++;
      order(row, 0) = static_cast<int32_t>(t * K + j);
      where(t, j) = static_cast<int32_t>(row);
    }
  Kokkos::deep_copy(exec, c.order, order);
  Kokkos::deep_copy(exec, c.where, where);
  fence(exec, "kqlora::sparse_mlp::order");  // (the host mirrors are freed on return)
}

/// xg(i) = x(token of slot order(i)).
template <class ExecSpace, class M>
void gather_rows(const ExecSpace& exec, const Matrix<M>& x, const IndexMatrix<M>& order, int64_t K,
                 const Matrix<M>& xg) {
  const int64_t H = x.extent(1);
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::gather", over(exec, xg.extent(0), H),
      KOKKOS_LAMBDA(int64_t i, int64_t f) { xg(i, f) = x(order(i, 0) / K, f); });
}

/// The k slots of token t in ascending expert order (the order transformers adds them in).
template <class M>
KOKKOS_INLINE_FUNCTION void slots_by_expert(const IndexMatrix<M>& chosen, int64_t t, int64_t K,
                                            int (&slot)[kMaxTopK]) {
  for (int64_t j = 0; j < K; ++j) {
    int64_t i = j;
    for (; i > 0 && chosen(t, slot[i - 1]) > chosen(t, j); --i) slot[i] = slot[i - 1];
    slot[i] = static_cast<int>(j);
  }
}

/// y(t) = sum over the token's slots, by ascending expert, of w * yg(row): each product
/// and each sum rounded in bfloat16, as transformers' products and index_add_.
template <class ExecSpace, class M>
void combine(const ExecSpace& exec, const SparseMlpCache<M>& c, bool bf16, const Matrix<M>& y) {
  const int64_t K = c.chosen.extent(1), H = y.extent(1);
  const auto chosen = c.chosen, where = c.where;
  const auto weight = c.weight, yg = c.yg;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::combine", over(exec, y.extent(0), H),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        int slot[kMaxTopK];
        slots_by_expert(chosen, t, K, slot);
        float s = 0;
        for (int64_t i = 0; i < K; ++i) {
          const int j = slot[i];
          float v = weight(t, j) * yg(where(t, j), f);
          if (bf16) v = round_to_bf16(v);
          s += v;
          if (bf16) s = round_to_bf16(s);
        }
        y(t, f) = s;
      });
}

/// gyg(row) = w * gy(t), and gw(t, j) = gy(t) . yg(row).
template <class ExecSpace, class M>
void combine_backward(const ExecSpace& exec, const SparseMlpCache<M>& c, const Matrix<M>& gy,
                      bool bf16, const SparseMlpScratch<M>& s) {
  const int64_t K = c.chosen.extent(1), H = gy.extent(1);
  const auto where = c.where;
  const auto weight = c.weight, yg = c.yg;
  const auto gyg = s.gyg, gw = s.gw;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::combine_backward", over(exec, gy.extent(0), K),
      KOKKOS_LAMBDA(int64_t t, int64_t j) {
        const int64_t row = where(t, j);
        const float w = weight(t, j);
        float dot = 0;
        for (int64_t f = 0; f < H; ++f) {
          const float g = gy(t, f);
          dot += g * yg(row, f);
          const float v = w * g;
          gyg(row, f) = bf16 ? round_to_bf16(v) : v;
        }
        gw(t, j) = bf16 ? round_to_bf16(dot) : dot;
      });
}

/// gx(t) = the sum of its slots' gxg rows.
template <class ExecSpace, class M>
void scatter_rows(const ExecSpace& exec, const SparseMlpCache<M>& c, const Matrix<M>& gxg,
                  bool bf16, const Matrix<M>& gx) {
  const int64_t K = c.chosen.extent(1);
  const auto chosen = c.chosen, where = c.where;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::scatter", over(exec, gx.extent(0), gx.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        int slot[kMaxTopK];
        slots_by_expert(chosen, t, K, slot);
        float s = 0;
        for (int64_t i = 0; i < K; ++i) {
          s += gxg(where(t, slot[i]), f);
          if (bf16) s = round_to_bf16(s);
        }
        gx(t, f) = s;
      });
}

/// The logits' gradient from the weights' (the router's softmax and top k, backward).
template <class ExecSpace, class M>
void route_backward(const ExecSpace& exec, const ExpertsSpec& spec, const SparseMlpCache<M>& c,
                    const SparseMlpScratch<M>& s) {
  const int64_t E = c.logits.extent(1), K = c.chosen.extent(1);
  const bool norm = spec.norm_topk, softmax_first = spec.router == RouterKind::softmax_topk;
  const auto logits = c.logits, weight = c.weight;
  const auto chosen = c.chosen;
  const auto gw = s.gw, gl = s.glogits;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::route_backward",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        for (int64_t e = 0; e < E; ++e) gl(t, e) = 0;
        // The chosen values' gradients: w_j = q_j / sum_i q_i (renormalised, or the softmax
        // over the k) gives dq_j = (gw_j - sum_i gw_i w_i) / sum_i q_i; plain w_j = q_j: gw_j.
        float mx = logits(t, 0);
        for (int64_t e = 1; e < E; ++e) mx = logits(t, e) > mx ? logits(t, e) : mx;
        float sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += fast_exp(logits(t, e) - mx);
        if (!softmax_first) {  // w = softmax over the k logits: dlogit_j = w_j (gw_j - <gw, w>)
          float dot = 0;
          for (int64_t j = 0; j < K; ++j) dot += gw(t, j) * weight(t, j);
          for (int64_t j = 0; j < K; ++j) gl(t, chosen(t, j)) = weight(t, j) * (gw(t, j) - dot);
          return;
        }
        float qsum = 0, dot = 0;
        for (int64_t j = 0; j < K; ++j) {
          const float q = fast_exp(logits(t, chosen(t, j)) - mx) / sum;
          qsum += q;
          dot += gw(t, j) * q;
        }
        // dp over all experts (zero but at the chosen), then the softmax's backward:
        // dlogit_e = p_e (dp_e - <dp, p>).
        float pdp = 0;
        for (int64_t j = 0; j < K; ++j) {
          const float q = fast_exp(logits(t, chosen(t, j)) - mx) / sum;
          const float dq = norm ? (gw(t, j) - dot / qsum) / qsum : gw(t, j);
          gl(t, chosen(t, j)) = dq;
          pdp += q * dq;
        }
        for (int64_t e = 0; e < E; ++e) {
          const float p = fast_exp(logits(t, e) - mx) / sum;
          gl(t, e) = p * (gl(t, e) - pdp);
        }
      });
}

/// Projection `which` (0 gate, 1 up, 2 down) of every expert as the grouped products read
/// it (nn/sparse_mlp_grouped.hpp).
template <class ExecSpace, class M>
GroupedProjection<M> grouped_projection(const ExecSpace& exec,
                                        const std::vector<ExpertWeights<M>>& experts, int which) {
  GroupedProjection<M> p;
  std::vector<const Nf4Tensor<M>*> w;
  std::vector<Matrix<M>> a, b, ga, gb;
  const auto bias_of = [&](const ExpertWeights<M>& e) {
    return which == 0 ? e.gate_bias : which == 1 ? e.up_bias : e.down_bias;
  };
  for (const ExpertWeights<M>& e : experts) {
    w.push_back(which == 0 ? e.gate : which == 1 ? e.up : e.down);
    if (!(which == 2 ? e.down_lora : e.gate_up_lora)) continue;
    const LoraAdapterViews<M>& ad = which == 0 ? e.gate_ad : which == 1 ? e.up_ad : e.down_ad;
    a.push_back(ad.a);
    b.push_back(ad.b);
    ga.push_back(ad.ga);
    gb.push_back(ad.gb);
    p.scale = ad.scale;
  }
  p.w = nf4_expert_matrices(exec, w);
  p.lora = !a.empty();
  if (p.lora) {
    p.a = dense_expert_matrices(exec, a);
    p.b = dense_expert_matrices(exec, b);
    p.ga = dense_expert_matrices(exec, ga);
    p.gb = dense_expert_matrices(exec, gb);
  }
  const auto b0 = bias_of(experts[0]);
  if (b0.data()) {  // (the rows of one [E, width] tensor, expert_weights' views of it)
    const int64_t width = b0.extent(0), E = static_cast<int64_t>(experts.size());
    for (int64_t e = 0; e < E; ++e)
      KQLORA_CHECK(bias_of(experts[e]).data() == b0.data() + e * width,
                   "grouped_projection: expert biases not one tensor");
    p.bias = Matrix<M>(const_cast<float*>(b0.data()), E, width);
  }
  return p;
}

/// The experts' act(gate) * up: the family's gated activation, or gpt-oss's clamped SwiGLU.
template <class ExecSpace, class M>
void expert_activation(const ExecSpace& exec, const ExpertsSpec& spec, Activation act,
                       const Matrix<M>& gate, const Matrix<M>& up, bool bf16, const Matrix<M>& a) {
  if (spec.swiglu_limit > 0)
    clamped_swiglu_forward(exec, ClampedSwiglu{spec.swiglu_alpha, spec.swiglu_limit}, gate, up,
                           bf16, a);
  else
    gated_mlp_forward(exec, act, gate, up, bf16, a);
}

template <class ExecSpace, class M>
void expert_activation_backward(const ExecSpace& exec, const ExpertsSpec& spec, Activation act,
                                const Matrix<M>& gate, const Matrix<M>& up, const Matrix<M>& ga,
                                bool bf16, const Matrix<M>& gg, const Matrix<M>& gu) {
  if (spec.swiglu_limit > 0)
    clamped_swiglu_backward(exec, ClampedSwiglu{spec.swiglu_alpha, spec.swiglu_limit}, gate, up, ga,
                            bf16, gg, gu);
  else
    gated_mlp_backward(exec, act, gate, up, ga, bf16, gg, gu);
}

}  // namespace impl

/// transformers' load-balancing loss (load_balancing_loss_func) over one forward's sparse
/// layers, on the tokens `real` marks (1: counted; padding 0): with p the softmax of a
/// layer's logits and the top k chosen as routed,
///   counts[e] = sum over layers and real tokens of [e chosen],  probs[e] = ... of p[e],
///   rows = layers x real tokens,  aux = E * sum_e (counts[e] / rows) (probs[e] / rows).
/// The counts are not differentiable: d aux / d p(t, e) = E counts[e] / rows^2 for a real t.
template <class M>
struct RouterAuxLoss {
  Kokkos::View<float*, M> real;            // [T]
  Kokkos::View<double*, M> counts, probs;  // [E], summed over the layers
  Kokkos::View<float*, M> grad;            // [E]: coef * weight * E * counts / rows^2
  double rows = 0;
};

/// real(i * S + t) = 1 for row i's positions up to its last scored label (prompts count,
/// the padding after it does not), else 0; returns how many are 1. (A free function: CUDA's
/// device lambdas may not sit in a class's private members.)
template <class ExecSpace, class M>
double mark_real_tokens(const ExecSpace& exec, const TokenMatrix<M>& labels,
                        const Kokkos::View<float*, M>& real) {
  const int64_t n = labels.extent(0), S = labels.extent(1);
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::real_tokens",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(int64_t i) {
        int64_t last = -1;  // (the row's last scored label; padding follows it)
        for (int64_t t = 1; t < S; ++t)
          if (labels(i, t) != kIgnoreLabel) last = t;
        for (int64_t t = 0; t < S; ++t) real(i * S + t) = t <= last ? 1.0f : 0.0f;
      });
  double tokens = 0;
  Kokkos::parallel_reduce(
      "kqlora::sparse_mlp::real_count",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, n * S),
      KOKKOS_LAMBDA(int64_t i, double& sum) { sum += real(i); }, tokens);
  return tokens;
}

namespace impl {

/// One layer's share of counts and probs (p into scratch [T, E] first).
template <class ExecSpace, class M>
void aux_accumulate(const ExecSpace& exec, const SparseMlpCache<M>& c, const Matrix<M>& p,
                    const RouterAuxLoss<M>& aux) {
  const int64_t T = c.logits.extent(0), E = c.logits.extent(1), K = c.chosen.extent(1);
  const auto logits = c.logits;
  const auto chosen = c.chosen;
  const auto real = aux.real;
  const auto counts = aux.counts, probs = aux.probs;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::aux_probs",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, T),
      KOKKOS_LAMBDA(int64_t t) {
        float mx = logits(t, 0);
        for (int64_t e = 1; e < E; ++e) mx = logits(t, e) > mx ? logits(t, e) : mx;
        float sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += fast_exp(logits(t, e) - mx);
        for (int64_t e = 0; e < E; ++e) p(t, e) = fast_exp(logits(t, e) - mx) / sum;
      });
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::aux_sums",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, E),
      KOKKOS_LAMBDA(int64_t e) {
        double n = 0, q = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (real(t) == 0) continue;
          q += p(t, e);
          for (int64_t j = 0; j < K; ++j) n += chosen(t, j) == e;
        }
        counts(e) += n;
        probs(e) += q;
      });
}

/// glogits(t) += the aux loss's gradient through the softmax: p (g - <g, p>), g = grad.
template <class ExecSpace, class M>
void aux_backward(const ExecSpace& exec, const SparseMlpCache<M>& c, const RouterAuxLoss<M>& aux,
                  const Matrix<M>& gl) {
  const int64_t E = c.logits.extent(1);
  const auto logits = c.logits;
  const auto real = aux.real;
  const auto g = aux.grad;
  Kokkos::parallel_for(
      "kqlora::sparse_mlp::aux_backward",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, logits.extent(0)),
      KOKKOS_LAMBDA(int64_t t) {
        if (real(t) == 0) return;
        float mx = logits(t, 0);
        for (int64_t e = 1; e < E; ++e) mx = logits(t, e) > mx ? logits(t, e) : mx;
        float sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += fast_exp(logits(t, e) - mx);
        float dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += fast_exp(logits(t, e) - mx) / sum * g(e);
        for (int64_t e = 0; e < E; ++e)
          gl(t, e) += fast_exp(logits(t, e) - mx) / sum * (g(e) - dot);
      });
}

}  // namespace impl

/// The sparse MLP's forward from x [T, H] into y [T, H]; `c` keeps what the backward reads.
/// `router` [E, H] (dense), `experts[e]` expert e's weights.
template <class ExecSpace, class M>
void sparse_mlp_forward(const ExecSpace& exec, const ExpertsSpec& spec, Activation act,
                        const RouterWeights<M>& router,
                        const std::vector<ExpertWeights<M>>& experts, const Matrix<M>& x, bool bf16,
                        SparseMlpCache<M>& c, LoraScratch<M>& lora, LinearNf4Workspace<M>& ws,
                        const Matrix<M>& y, const RouterAuxLoss<M>* aux = nullptr,
                        const Matrix<M>& aux_scratch = {}, const Matrix<M>& router_x = {}) {
  const int64_t E = spec.experts, K = spec.top_k;
  KQLORA_CHECK(K <= kMaxTopK && static_cast<int64_t>(experts.size()) == E,
               "sparse_mlp_forward: top_k " << K << " or experts");
  // (route_backward recomputes the softmax of the logits where the weights are scaled)
  KQLORA_CHECK(!router.per_expert_scale.data() || spec.router == RouterKind::softmax_topk,
               "sparse_mlp_forward: per-expert scales with a softmax over the top k");
  // (the router reads router_x where given: Gemma 4's, its own norm of the residual)
  gemm(exec, "N", "T", 1.0f, router_x.data() ? router_x : x, router.weight, 0.0f, c.logits);
  if (router.bias.data())
    add_bias(exec, router.bias, bf16, c.logits);  // (one rounding of the sum, as addmm)
  else if (bf16)
    round_bf16(exec, c.logits);
  impl::route(exec, spec, bf16, c.logits, c.chosen, c.weight, router.per_expert_scale);
  if (aux) impl::aux_accumulate(exec, c, aux_scratch, *aux);
  impl::group_by_expert(exec, E, c);
  impl::gather_rows(exec, x, c.order, K, c.xg);
  if (grouped_expert_products<M>()) {
    grouped_projection_forward(exec, impl::grouped_projection(exec, experts, 0), c.offsets, c.xg,
                               bf16, c.h_gate_up, c.gate);
    grouped_projection_forward(exec, impl::grouped_projection(exec, experts, 1), c.offsets, c.xg,
                               bf16, c.h_gate_up, c.up);
    impl::expert_activation(exec, spec, act, c.gate, c.up, bf16, c.act);
    grouped_projection_forward(exec, impl::grouped_projection(exec, experts, 2), c.offsets, c.act,
                               bf16, c.h_down, c.yg);
    impl::combine(exec, c, bf16, y);
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = c.offsets[e], b = c.offsets[e + 1];
    if (a == b) continue;
    const Matrix<M> xe = impl::row_block(c.xg, a, b);
    const ExpertWeights<M>& w = experts[e];
    // (gate and up share their adapter's A: each computes the same h, kept once)
    const Matrix<M> h = w.gate_up_lora ? impl::row_block(c.h_gate_up, a, b) : Matrix<M>();
    lora_projection_forward<ExecSpace, M>(exec, *w.gate, w.gate_up_lora ? &w.gate_ad : nullptr, xe,
                                          xe, bf16, h, lora, ws, impl::row_block(c.gate, a, b),
                                          w.gate_bias);
    lora_projection_forward<ExecSpace, M>(exec, *w.up, w.gate_up_lora ? &w.up_ad : nullptr, xe, xe,
                                          bf16, h, lora, ws, impl::row_block(c.up, a, b),
                                          w.up_bias);
  }
  impl::expert_activation(exec, spec, act, c.gate, c.up, bf16, c.act);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = c.offsets[e], b = c.offsets[e + 1];
    if (a == b) continue;
    const Matrix<M> ae = impl::row_block(c.act, a, b);
    const ExpertWeights<M>& w = experts[e];
    lora_projection_forward<ExecSpace, M>(
        exec, *w.down, w.down_lora ? &w.down_ad : nullptr, ae, ae, bf16,
        w.down_lora ? impl::row_block(c.h_down, a, b) : Matrix<M>(), lora, ws,
        impl::row_block(c.yg, a, b), w.down_bias);
  }
  impl::combine(exec, c, bf16, y);
}

/// sparse_mlp_backward's experts on the host: each expert's products on its rows.
template <class ExecSpace, class M>
void sparse_mlp_experts_backward_loop(const ExecSpace& exec, const ExpertsSpec& spec,
                                      Activation act, const std::vector<ExpertWeights<M>>& experts,
                                      const SparseMlpCache<M>& c, bool bf16,
                                      const SparseMlpScratch<M>& s, LoraScratch<M>& lora,
                                      LinearNf4Workspace<M>& ws) {
  const int64_t E = spec.experts;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = c.offsets[e], b = c.offsets[e + 1];
    if (a == b) continue;
    const ExpertWeights<M>& w = experts[e];
    lora_projection_backward<ExecSpace, M>(
        exec, *w.down, w.down_lora ? &w.down_ad : nullptr, impl::row_block(s.gyg, a, b),
        impl::row_block(c.act, a, b), w.down_lora ? impl::row_block(c.h_down, a, b) : Matrix<M>(),
        true, nullptr, bf16, lora, ws, 0.0f, impl::row_block(s.gact, a, b));
  }
  impl::expert_activation_backward(exec, spec, act, c.gate, c.up, s.gact, bf16, s.ggate, s.gup);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = c.offsets[e], b = c.offsets[e + 1];
    if (a == b) continue;
    const Matrix<M> gxe = impl::row_block(s.gxg, a, b), xe = impl::row_block(c.xg, a, b);
    const ExpertWeights<M>& w = experts[e];
    const Matrix<M> h = w.gate_up_lora ? impl::row_block(c.h_gate_up, a, b) : Matrix<M>();
    lora_projection_backward<ExecSpace, M>(exec, *w.gate, w.gate_up_lora ? &w.gate_ad : nullptr,
                                           impl::row_block(s.ggate, a, b), xe, h, true, nullptr,
                                           bf16, lora, ws, 0.0f, gxe);
    lora_projection_backward<ExecSpace, M>(exec, *w.up, w.gate_up_lora ? &w.up_ad : nullptr,
                                           impl::row_block(s.gup, a, b), xe, h, true, nullptr, bf16,
                                           lora, ws, 1.0f, gxe);
  }
}

/// The backward: gx = the input's gradient from gy (the output's), through the experts
/// and the routing weights. The experts' adapter gradients are added into their ga and gb
/// (the caller zeroes them first where a pass starts afresh: gate and up add into one A's).
template <class ExecSpace, class M>
void sparse_mlp_backward(const ExecSpace& exec, const ExpertsSpec& spec, Activation act,
                         const RouterWeights<M>& router,
                         const std::vector<ExpertWeights<M>>& experts, const SparseMlpCache<M>& c,
                         const Matrix<M>& gy, bool bf16, const SparseMlpScratch<M>& s,
                         LoraScratch<M>& lora, LinearNf4Workspace<M>& ws, const Matrix<M>& gx,
                         const RouterAuxLoss<M>* aux = nullptr, const Matrix<M>& router_gx = {}) {
  impl::combine_backward(exec, c, gy, bf16, s);
  if (grouped_expert_products<M>()) {
    // (each adapter's gh in a buffer free at that point: gxg before gate and up write it,
    // gact after the activation's backward has read it)
    const int64_t rows = c.xg.extent(0), r = c.h_gate_up.data() ? c.h_gate_up.extent(1)
                                             : c.h_down.data()  ? c.h_down.extent(1)
                                                                : 0;
    grouped_projection_backward(exec, impl::grouped_projection(exec, experts, 2), c.offsets, s.gyg,
                                c.act, c.h_down, bf16, Matrix<M>(s.gxg.data(), rows, r), 0.0f,
                                s.gact);
    impl::expert_activation_backward(exec, spec, act, c.gate, c.up, s.gact, bf16, s.ggate, s.gup);
    const Matrix<M> gh(s.gact.data(), rows, r);
    grouped_projection_backward(exec, impl::grouped_projection(exec, experts, 0), c.offsets,
                                s.ggate, c.xg, c.h_gate_up, bf16, gh, 0.0f, s.gxg);
    grouped_projection_backward(exec, impl::grouped_projection(exec, experts, 1), c.offsets, s.gup,
                                c.xg, c.h_gate_up, bf16, gh, 1.0f, s.gxg);
  } else {
    sparse_mlp_experts_backward_loop(exec, spec, act, experts, c, bf16, s, lora, ws);
  }
  impl::scatter_rows(exec, c, s.gxg, bf16, gx);
  if (router.per_expert_scale.data()) {  // (w = renormalised * scale: the former's gradient)
    const auto gw = s.gw;
    const auto chosen = c.chosen;
    const auto pes = router.per_expert_scale;
    Kokkos::parallel_for(
        "kqlora::sparse_mlp::per_expert_scale_backward", over(exec, gw.extent(0), gw.extent(1)),
        KOKKOS_LAMBDA(int64_t t, int64_t j) { gw(t, j) *= pes(chosen(t, j)); });
  }
  impl::route_backward(exec, spec, c, s);
  if (aux) impl::aux_backward(exec, c, *aux, s.glogits);
  // gx += dlogits R (or, where the router reads its own input, router_gx = dlogits R)
  const bool own = router_gx.data() != nullptr;
  gemm(exec, "N", "N", 1.0f, s.glogits, router.weight, own ? 0.0f : 1.0f, own ? router_gx : gx);
  if (bf16) round_bf16(exec, gx);
  if (bf16 && own) round_bf16(exec, router_gx);
}

}  // namespace kqlora
