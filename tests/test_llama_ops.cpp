// The Llama model's kernels against float64: each forward against the formula computed in
// double, each backward against central finite differences of L = sum(gy * f(x)) in
// double, on every enabled execution space. Shapes are small and not multiples of any
// vector width; GQA with 2 query heads per kv head; several cross-entropy chunks; dropout
// with its fixed mask.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "exec_spaces.hpp"
#include "kqlora/nn/attention.hpp"
#include "kqlora/nn/embedding.hpp"
#include "kqlora/nn/gated_mlp.hpp"
#include "kqlora/nn/lm_head_cross_entropy.hpp"
#include "kqlora/nn/lora_projection.hpp"
#include "kqlora/nn/residual.hpp"
#include "kqlora/nn/rotary.hpp"
#include "kqlora/quant/nf4_kernels.hpp"
#include "matrix_util.hpp"
#include "nf4_test_util.hpp"

namespace {

using D = std::vector<double>;

using kqlora_test::host;
using kqlora_test::matrix;

D widen(const std::vector<float>& v) {
  return D(v.begin(), v.end());
}

double dot(const D& a, const D& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// dL/dx_i of L = dot(gy, f(x)) by central differences, for every i.
D finite_difference(const std::function<D(const D&)>& f, D x, const D& gy, double h = 1e-6) {
  D g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = dot(gy, f(x));
    x[i] = keep - h;
    const double lm = dot(gy, f(x));
    x[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// max |a - b| <= tol * max |b|
void expect_close(const std::vector<float>& a, const D& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double d = 0, m = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) > d) {
      d = std::fabs(a[i] - b[i]);
      at = i;
    }
    m = std::max(m, std::fabs(b[i]));
  }
  EXPECT_LE(d, tol * m) << what << ": [" << at << "] " << a[at] << " vs " << b[at];
}

constexpr int64_t kSeqs = 2, kS = 66, kHeads = 4, kKv = 2, kDim = 2;  // S: two row blocks

std::vector<float> inv_freq(int64_t head_dim, double theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / head_dim));
  return f;
}

// Rotate-half rope of [tokens, heads * Dh] in double (cos/sin of float32 angles, as the
// kernel's table).
D rope_ref(const D& x, int64_t heads, int64_t Dh, const std::vector<float>& freq) {
  D y = x;
  const int64_t half = Dh / 2, width = heads * Dh;
  for (int64_t t = 0; t < static_cast<int64_t>(x.size()) / width; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(t % kS) * freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        const int64_t a = t * width + h * Dh + i, b = a + half;
        y[a] = x[a] * c - x[b] * s;
        y[b] = x[b] * c + x[a] * s;
      }
  return y;
}

// What sets a family's attention apart (attention_ref's defaults: Llama's).
struct AttentionOptions {
  double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  double softcap = 0;              // c tanh(z / c) on the scaled scores
  int64_t window = 0;              // key j visible to query i iff i - j < window
  std::vector<int32_t> doc_start;  // [kSeqs * kS]: the position i's document starts at
};

// Causal GQA attention in double; q [T, H*Dh], k, v [T, KV*Dh].
D attention_ref(const D& q, const D& k, const D& v, const AttentionOptions& a = {}) {
  const int64_t Q = kHeads * kDim, KV = kKv * kDim, group = kHeads / kKv;
  D o(q.size(), 0.0);
  for (int64_t s = 0; s < kSeqs; ++s)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < kS; ++i) {
        int64_t first = a.window > 0 ? std::max<int64_t>(0, i - a.window + 1) : 0;
        if (!a.doc_start.empty()) first = std::max<int64_t>(first, a.doc_start[s * kS + i]);
        D p(static_cast<size_t>(i + 1), 0.0);
        double m = -1e300, z = 0;
        for (int64_t j = first; j <= i; ++j) {
          double sc = 0;
          for (int64_t d = 0; d < kDim; ++d)
            sc += q[(s * kS + i) * Q + h * kDim + d] * k[(s * kS + j) * KV + g * kDim + d];
          p[j] = sc * a.scale;
          if (a.softcap > 0) p[j] = a.softcap * std::tanh(p[j] / a.softcap);
          m = std::max(m, p[j]);
        }
        for (int64_t j = first; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
        for (int64_t j = first; j <= i; ++j)
          for (int64_t d = 0; d < kDim; ++d)
            o[(s * kS + i) * Q + h * kDim + d] += p[j] / z * v[(s * kS + j) * KV + g * kDim + d];
      }
    }
  return o;
}

}  // namespace

template <class E>
class LlamaOps : public ::testing::Test {};
TYPED_TEST_SUITE(LlamaOps, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

TYPED_TEST(LlamaOps, RotaryForwardAndBackward) {
  using M = typename TypeParam::memory_space;
  const int64_t T = kSeqs * kS, H = 3, Dh = 8;
  const auto freq = inv_freq(Dh, 500.0);
  const kqlora::RopeTable<M> rope(freq, kS, false);
  const auto xf = nf4test::randn(T * H * Dh, 11), gf = nf4test::randn(T * H * Dh, 12);
  auto x = matrix<M>(xf, T, H * Dh), g = matrix<M>(gf, T, H * Dh);
  kqlora::rope_apply(TypeParam(), rope, kS, Dh, false, false, x);
  kqlora::rope_apply(TypeParam(), rope, kS, Dh, true, false, g);
  auto f = [&](const D& in) { return rope_ref(in, H, Dh, freq); };
  expect_close(host(x), f(widen(xf)), 1e-6, "rope forward");
  expect_close(host(g), finite_difference(f, widen(xf), widen(gf)), 1e-6, "rope backward");
}

TYPED_TEST(LlamaOps, CausalGroupedQueryAttentionForwardAndBackward) {
  using M = typename TypeParam::memory_space;
  const int64_t T = kSeqs * kS, Q = kHeads * kDim, KV = kKv * kDim;
  const auto qf = nf4test::randn(T * Q, 21), kf = nf4test::randn(T * KV, 22),
             vf = nf4test::randn(T * KV, 23), gf = nf4test::randn(T * Q, 24);
  auto q = matrix<M>(qf, T, Q), k = matrix<M>(kf, T, KV), v = matrix<M>(vf, T, KV);
  auto go = matrix<M>(gf, T, Q);
  kqlora::Matrix<M> o("o", T, Q), gq("gq", T, Q), gk("gk", T, KV), gv("gv", T, KV);
  Kokkos::View<float*, M> lse("lse", kSeqs * kHeads * kS);
  // The host's fused kernel (where built), one head at a time through gemm and every head
  // of a row block at once (a GPU's way: strided-batched products), each against float64.
  for (int mode = 0; mode < 3; ++mode) {
    kqlora::AttentionWorkspace<M> ws;
    ws.fused_host = mode == 0;
    ws.batch_heads = mode == 2;
    const std::string tag = mode == 0 ? " (fused)" : mode == 1 ? " (gemm)" : " (heads at once)";
    const kqlora::AttentionShape shape{kSeqs, kS, kHeads, kKv, kDim};
    kqlora::causal_attention_forward(TypeParam(), shape, q, k, v, false, ws, o, lse);
    kqlora::causal_attention_backward(TypeParam(), shape, q, k, v, o, lse, go, false, ws, gq, gk,
                                      gv);
    const D q64 = widen(qf), k64 = widen(kf), v64 = widen(vf), g64 = widen(gf);
    expect_close(host(o), attention_ref(q64, k64, v64), 1e-6, "attention forward" + tag);
    expect_close(
        host(gq),
        finite_difference([&](const D& x) { return attention_ref(x, k64, v64); }, q64, g64), 1e-5,
        "dq" + tag);
    expect_close(
        host(gk),
        finite_difference([&](const D& x) { return attention_ref(q64, x, v64); }, k64, g64), 1e-5,
        "dk" + tag);
    expect_close(
        host(gv),
        finite_difference([&](const D& x) { return attention_ref(q64, k64, x); }, v64, g64), 1e-5,
        "dv" + tag);
  }
}

// Gemma's and Mistral's attention: another scale, a soft-cap that bends (scores of a few
// units, cap 0.9), a window of 5 (the second row block's keys start at 60, not 0) and,
// in the first sequence, a document boundary at position 30 (a packed row).
TYPED_TEST(LlamaOps, WindowedSoftCappedAttentionWithDocumentsForwardAndBackward) {
  using M = typename TypeParam::memory_space;
  const int64_t T = kSeqs * kS, Q = kHeads * kDim, KV = kKv * kDim;
  const auto qf = nf4test::randn(T * Q, 25, 2.0f), kf = nf4test::randn(T * KV, 26, 2.0f),
             vf = nf4test::randn(T * KV, 27), gf = nf4test::randn(T * Q, 28);
  auto q = matrix<M>(qf, T, Q), k = matrix<M>(kf, T, KV), v = matrix<M>(vf, T, KV);
  auto go = matrix<M>(gf, T, Q);
  AttentionOptions opt;
  opt.scale = 0.8;
  opt.softcap = 0.9;
  opt.window = 5;
  opt.doc_start.assign(static_cast<size_t>(T), 0);
  for (int64_t i = 30; i < kS; ++i) opt.doc_start[i] = 30;
  kqlora::DocStarts<M> docs;
  {
    Kokkos::View<int32_t**, Kokkos::LayoutRight, M> d("docs", kSeqs, kS);
    auto hd = Kokkos::create_mirror_view(d);
    for (int64_t t = 0; t < T; ++t) hd(t / kS, t % kS) = opt.doc_start[t];
    Kokkos::deep_copy(d, hd);
    docs = d;
  }
  for (int run = 0; run < 6; ++run) {
    // With and without documents; fused (the host's), one head at a time through gemm and
    // every head at once.
    const bool with_docs = run % 2 == 1, batched = run >= 4, fused = run < 2;
    AttentionOptions o_ref = opt;
    if (!with_docs) o_ref.doc_start.clear();
    const kqlora::DocStarts<M> d = with_docs ? docs : kqlora::DocStarts<M>();
    kqlora::Matrix<M> o("o", T, Q), gq("gq", T, Q), gk("gk", T, KV), gv("gv", T, KV);
    Kokkos::View<float*, M> lse("lse", kSeqs * kHeads * kS);
    kqlora::AttentionWorkspace<M> ws;
    ws.batch_heads = batched;
    ws.fused_host = fused;
    kqlora::AttentionShape shape{kSeqs, kS, kHeads, kKv, kDim};
    shape.attn_scale = static_cast<float>(opt.scale);
    shape.softcap = static_cast<float>(opt.softcap);
    shape.window = opt.window;
    kqlora::causal_attention_forward(TypeParam(), shape, q, k, v, false, ws, o, lse, d);
    kqlora::causal_attention_backward(TypeParam(), shape, q, k, v, o, lse, go, false, ws, gq, gk,
                                      gv, d);
    const D q64 = widen(qf), k64 = widen(kf), v64 = widen(vf), g64 = widen(gf);
    const std::string tag =
        std::string(with_docs ? " (documents)" : "") + (fused     ? " (fused)"
                                                        : batched ? " (heads at once)"
                                                                  : " (gemm)");
    expect_close(host(o), attention_ref(q64, k64, v64, o_ref), 1e-6, "forward" + tag);
    auto f = [&](const D& x, int which) {
      return attention_ref(which == 0 ? x : q64, which == 1 ? x : k64, which == 2 ? x : v64, o_ref);
    };
    expect_close(host(gq), finite_difference([&](const D& x) { return f(x, 0); }, q64, g64), 1e-5,
                 "dq" + tag);
    expect_close(host(gk), finite_difference([&](const D& x) { return f(x, 1); }, k64, g64), 1e-5,
                 "dk" + tag);
    expect_close(host(gv), finite_difference([&](const D& x) { return f(x, 2); }, v64, g64), 1e-5,
                 "dv" + tag);
  }
}

// The gated MLP a = act(g) * u of `act` against `act_ref` in double: the forward, and both
// input gradients against central differences.
template <class E>
void check_gated_mlp(kqlora::Activation act, double (*act_ref)(double), int64_t T, int64_t I,
                     unsigned seed, const std::string& tag) {
  using M = typename E::memory_space;
  const auto gf = nf4test::randn(T * I, seed, 2.0f), uf = nf4test::randn(T * I, seed + 1),
             af = nf4test::randn(T * I, seed + 2);
  auto g = matrix<M>(gf, T, I), u = matrix<M>(uf, T, I), ga = matrix<M>(af, T, I);
  kqlora::Matrix<M> a("a", T, I), gg("gg", T, I), gu("gu", T, I);
  kqlora::gated_mlp_forward(E(), act, g, u, false, a);
  kqlora::gated_mlp_backward(E(), act, g, u, ga, false, gg, gu);
  auto ref = [&](const D& gate, const D& up) {
    D y(gate.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = act_ref(gate[i]) * up[i];
    return y;
  };
  const D g64 = widen(gf), u64 = widen(uf), a64 = widen(af);
  expect_close(host(a), ref(g64, u64), 1e-6, tag + " forward");
  expect_close(host(gg), finite_difference([&](const D& x) { return ref(x, u64); }, g64, a64), 1e-5,
               tag + " d gate");
  expect_close(host(gu), finite_difference([&](const D& x) { return ref(g64, x); }, u64, a64), 1e-5,
               tag + " d up");
}

// Gemma's GeGLU: PyTorch's gelu(approximate="tanh") times up.
TYPED_TEST(LlamaOps, GeluTanhGatedMlpForwardAndBackward) {
  check_gated_mlp<TypeParam>(
      kqlora::Activation::gelu_tanh,
      [](double x) {
        return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      },
      5, 9, 35, "geglu");
}

TYPED_TEST(LlamaOps, SwigluForwardAndBackward) {
  check_gated_mlp<TypeParam>(
      kqlora::Activation::silu, [](double x) { return x / (1 + std::exp(-x)); }, 7, 13, 31,
      "swiglu");
}

TYPED_TEST(LlamaOps, FusedLmHeadCrossEntropyInChunks) {
  using M = typename TypeParam::memory_space;
  const int64_t n = 3, S = 5, T = n * S, H = 6, V = 11;
  const auto hf = nf4test::randn(T * H, 41), wf = nf4test::randn(V * H, 42);
  std::vector<int32_t> labels(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) labels[t] = static_cast<int32_t>((t * 7 + 3) % V);
  labels[1] = labels[7] = labels[14] = kqlora::kIgnoreLabel;  // a prompt and padding
  kqlora::TokenMatrix<M> lab("labels", n, S);
  auto hl = Kokkos::create_mirror_view(lab);
  double count = 0;
  for (int64_t t = 0; t < T; ++t) {
    hl(t / S, t % S) = labels[t];
    if (t % S > 0 && labels[t] != kqlora::kIgnoreLabel) count += 1;
  }
  Kokkos::deep_copy(lab, hl);
  auto h = matrix<M>(hf, T, H), W = matrix<M>(wf, V, H);
  kqlora::Matrix<M> gh("gh", T, H);
  const D W64 = widen(wf);
  // Float64: logits at t scored against labels[t + 1] within each sequence (rounded to
  // bfloat16 first with `bf16`), then divided (rounded again) or soft-capped as `fl` says;
  // `first_max_after` receives how many scored rows have their largest logit at or past
  // that vocabulary entry.
  using kqlora::FinalLogits;
  auto ref_loss = [&](const D& x, FinalLogits fl, bool bf16, int64_t first_max_after = 0,
                      int64_t* past = nullptr) {
    const double cap = fl.softcap, div = fl.divisor;
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t % S + 1 >= S || labels[t + 1] == kqlora::kIgnoreLabel) continue;
      D z(static_cast<size_t>(V), 0.0);
      double m = -1e300, e = 0;
      int64_t arg = 0;
      for (int64_t v = 0; v < V; ++v) {
        for (int64_t f = 0; f < H; ++f) z[v] += x[t * H + f] * W64[v * H + f];
        if (bf16) z[v] = kqlora::round_to_bf16(static_cast<float>(z[v]));
        if (div > 0) z[v] /= div;
        if (bf16 && div > 0) z[v] = kqlora::round_to_bf16(static_cast<float>(z[v]));
        if (cap > 0) z[v] = cap * std::tanh(z[v] / cap);
        if (z[v] > m) arg = v;
        m = std::max(m, z[v]);
      }
      if (past && arg >= first_max_after) ++*past;
      for (double zv : z) e += std::exp(zv - m);
      sum += std::log(e) + m - z[labels[t + 1]];
    }
    return D{sum / count};
  };
  // float32 goes over the vocabulary in chunks: one pass of one chunk (the defaults), and
  // passes of 4 tokens over chunks of 4 entries (the last of each partial), where the
  // running maximum of some rows moves to a later chunk (asserted below). With h given up
  // as scratch, over the 9 scored tokens only (h's copy is overwritten).
  using kqlora::HiddenAfter;
  for (const int64_t pieces : {int64_t(0), int64_t(4)})
    // none, Gemma's final-logit soft-cap (bending), Granite's logits divisor
    for (const FinalLogits fl : {FinalLogits{}, FinalLogits{0.0f, 1.5f}, FinalLogits{1.7f, 0.0f}})
      for (const HiddenAfter hidden : {HiddenAfter::kept, HiddenAfter::scratch}) {
        kqlora::CrossEntropyWorkspace<M> ws;
        if (pieces > 0) ws.pass_tokens = ws.vocab_chunk = pieces;
        const std::string tag = "cap " + std::to_string(fl.softcap) + ", divisor " +
                                std::to_string(fl.divisor) + ", pieces " + std::to_string(pieces) +
                                (hidden == HiddenAfter::scratch ? ", scored rows only" : "");
        const auto hin = matrix<M>(hf, T, H);
        Kokkos::deep_copy(gh, 7.0f);  // (every row is written)
        const double loss =
            kqlora::lm_head_cross_entropy(TypeParam(), hin, W, lab, count, false, gh, ws, fl,
                                          kqlora::GemmInputs::float32, hidden);
        if (hidden == HiddenAfter::scratch) {
          const auto g = host(gh);
          for (int64_t t = 0; t < T; ++t)
            if (t % S + 1 >= S || labels[t + 1] == kqlora::kIgnoreLabel)
              for (int64_t f = 0; f < H; ++f) EXPECT_EQ(g[t * H + f], 0.0) << tag << ", row " << t;
        }
        int64_t moved = 0;
        EXPECT_NEAR(loss, ref_loss(widen(hf), fl, false, 4, &moved)[0], 1e-6 * std::fabs(loss))
            << tag;
        EXPECT_GT(moved, 0) << tag << ": no row's largest logit past the first chunk";
        expect_close(host(gh),
                     finite_difference([&](const D& x) { return ref_loss(x, fl, false); },
                                       widen(hf), D{1.0}),
                     1e-5, "d hidden, " + tag);
        // Without gradients: the same loss (over every row: the products' sums may differ
        // in the last bits with their row count).
        const double again = kqlora::lm_head_cross_entropy(TypeParam(), h, W, lab, count, false,
                                                           kqlora::Matrix<M>(), ws, fl);
        if (hidden == HiddenAfter::kept)
          EXPECT_EQ(again, loss) << tag;
        else
          EXPECT_NEAR(again, loss, 1e-6 * std::fabs(loss)) << tag;
      }
  // bfloat16 goes over the tokens in chunks (its logits' gradient is rounded too): four of
  // 4 tokens, the last partial. Against float64 with the logits rounded alike (the loss)
  // and unrounded (the gradient: within bfloat16's rounding of each logit and its gradient);
  // without and with a divisor.
  for (const FinalLogits fl : {FinalLogits{}, FinalLogits{1.7f, 0.0f}}) {
    kqlora::CrossEntropyWorkspace<M> ws;
    ws.chunk_bytes = 4 * 4 * V;
    const std::string tag = "bfloat16, divisor " + std::to_string(fl.divisor);
    const double loss =
        kqlora::lm_head_cross_entropy(TypeParam(), h, W, lab, count, true, gh, ws, fl);
    EXPECT_NEAR(loss, ref_loss(widen(hf), fl, true)[0], 1e-3 * std::fabs(loss)) << tag;
    expect_close(
        host(gh),
        finite_difference([&](const D& x) { return ref_loss(x, fl, false); }, widen(hf), D{1.0}),
        3e-2, "d hidden, " + tag);
  }
}

// No token scored (a micro-batch of prompts only): a zero loss and a zero gradient, with h
// kept and with h given up as scratch (where no row is gathered).
TYPED_TEST(LlamaOps, FusedLmHeadCrossEntropyWithNoScoredToken) {
  using M = typename TypeParam::memory_space;
  const int64_t n = 2, S = 4, T = n * S, H = 6, V = 11;
  const auto hf = nf4test::randn(T * H, 43), wf = nf4test::randn(V * H, 44);
  kqlora::TokenMatrix<M> lab("labels", n, S);
  Kokkos::deep_copy(lab, kqlora::kIgnoreLabel);
  const auto W = matrix<M>(wf, V, H);
  kqlora::Matrix<M> gh("gh", T, H);
  using kqlora::HiddenAfter;
  for (const HiddenAfter hidden : {HiddenAfter::kept, HiddenAfter::scratch}) {
    kqlora::CrossEntropyWorkspace<M> ws;
    Kokkos::deep_copy(gh, 7.0f);
    const double loss =
        kqlora::lm_head_cross_entropy(TypeParam(), matrix<M>(hf, T, H), W, lab, 1.0, false, gh, ws,
                                      kqlora::FinalLogits{}, kqlora::GemmInputs::float32, hidden);
    EXPECT_EQ(loss, 0.0);
    for (const float g : host(gh)) ASSERT_EQ(g, 0.0f);
  }
}

TYPED_TEST(LlamaOps, LoraProjectionWithDropoutForwardAndBackward) {
  using M = typename TypeParam::memory_space;
  const int64_t T = 6, in = 32, out = 24, r = 3;
  const float scale = 2.0f / r, p = 0.3f;
  const auto wf = nf4test::randn(out * in, 51), xf = nf4test::randn(T * in, 52),
             af = nf4test::randn(r * in, 53, 0.3f), bf = nf4test::randn(out * r, 54, 0.3f),
             gf = nf4test::randn(T * out, 55);
  kqlora::Nf4Layout layout;
  layout.shape = {out, in};
  layout.block_size = 32;
  layout.scaler_block_size = 4;  // 24 blocks: 6 scaler blocks
  const auto W = kqlora::nf4_quantize<float>(
      TypeParam(), Kokkos::View<const float*, M>(nf4test::to_device<float, M>(wf)), layout, "w");
  // The weights the product sees: the NF4 dequantization.
  Kokkos::View<float*, M> wd("wd", out * in);
  kqlora::nf4_dequantize<float>(TypeParam(), W, wd);
  auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), wd);
  const D W64(wh.data(), wh.data() + out * in);
  const kqlora::DropoutKey key{7, 99, 2, 4, 1, in, p};
  kqlora::LoraAdapterViews<M> lora;
  lora.a = matrix<M>(af, r, in);
  lora.b = matrix<M>(bf, out, r);
  lora.ga = kqlora::Matrix<M>("ga", r, in);
  lora.gb = kqlora::Matrix<M>("gb", out, r);
  lora.scale = scale;
  auto x = matrix<M>(xf, T, in), gy = matrix<M>(gf, T, out);
  kqlora::Matrix<M> xd("xd", T, in), h("h", T, r), y("y", T, out), gx("gx", T, in);
  kqlora::LoraScratch<M> scratch{kqlora::Matrix<M>("gh", T, r), kqlora::Matrix<M>("tmp", T, in)};
  kqlora::LinearNf4Workspace<M> ws;
  kqlora::dropout_apply(TypeParam(), key, false, x, xd, 0.0f);
  kqlora::lora_projection_forward(TypeParam(), W, &lora, x, xd, false, h, scratch, ws, y);
  kqlora::lora_projection_backward(TypeParam(), W, &lora, gy, xd, h, false, &key, false, scratch,
                                   ws, 0.0f, gx);
  // Float64, the same mask.
  auto f = [&](const D& xv, const D& av, const D& bv) {
    D yv(static_cast<size_t>(T * out), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      D hv(static_cast<size_t>(r), 0.0);
      for (int64_t j = 0; j < r; ++j)
        for (int64_t i = 0; i < in; ++i)
          hv[j] += (key.keep(t, i) ? xv[t * in + i] / (1 - p) : 0.0) * av[j * in + i];
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) yv[t * out + o] += xv[t * in + i] * W64[o * in + i];
        for (int64_t j = 0; j < r; ++j) yv[t * out + o] += scale * hv[j] * bv[o * r + j];
      }
    }
    return yv;
  };
  const D x64 = widen(xf), a64 = widen(af), b64 = widen(bf), g64 = widen(gf);
  expect_close(host(y), f(x64, a64, b64), 1e-5, "forward");
  expect_close(host(gx), finite_difference([&](const D& v) { return f(v, a64, b64); }, x64, g64),
               1e-5, "dx");
  expect_close(host(lora.ga),
               finite_difference([&](const D& v) { return f(x64, v, b64); }, a64, g64), 1e-5, "dA");
  expect_close(host(lora.gb),
               finite_difference([&](const D& v) { return f(x64, a64, v); }, b64, g64), 1e-5, "dB");
}

TYPED_TEST(LlamaOps, EmbeddingGathersRows) {
  using M = typename TypeParam::memory_space;
  const int64_t V = 9, F = 5, n = 2, S = 4;
  const auto table = nf4test::randn(V * F, 61);
  kqlora::TokenMatrix<M> ids("ids", n, S);
  auto hi = Kokkos::create_mirror_view(ids);
  for (int64_t t = 0; t < n * S; ++t) hi(t / S, t % S) = static_cast<int32_t>((t * 5) % V);
  Kokkos::deep_copy(ids, hi);
  kqlora::Matrix<M> x("x", n * S, F);
  kqlora::embedding_forward(
      TypeParam(), Kokkos::View<const float*, M>(nf4test::to_device<float, M>(table)), ids, x);
  const auto got = host(x);
  for (int64_t t = 0; t < n * S; ++t)
    for (int64_t f = 0; f < F; ++f)
      ASSERT_EQ(got[t * F + f], table[((t * 5) % V) * F + f]) << t << "," << f;
}

// The residual stream's sum out = x + y in one pass: each element the float sum of the two
// (float64's sum rounded to float), in bfloat16 rounded once more; x and y untouched.
TYPED_TEST(LlamaOps, ResidualSumIsTheElementwiseSum) {
  using M = typename TypeParam::memory_space;
  const int64_t T = 6, F = 40;
  const auto xf = nf4test::randn(T * F, 71), yf = nf4test::randn(T * F, 72);
  for (const bool bf16 : {false, true}) {
    auto x = kqlora_test::matrix<M>(xf, T, F), y = kqlora_test::matrix<M>(yf, T, F);
    kqlora::Matrix<M> out("out", T, F);
    kqlora::residual_sum(TypeParam(), x, y, bf16, out);
    const auto got = host(out), xs = host(x), ys = host(y);
    for (int64_t i = 0; i < T * F; ++i) {
      const float sum = static_cast<float>(static_cast<double>(xf[i]) + yf[i]);
      ASSERT_EQ(got[i], bf16 ? kqlora::round_to_bf16(sum) : sum) << i;
      ASSERT_EQ(xs[i], xf[i]) << i;
      ASSERT_EQ(ys[i], yf[i]) << i;
    }
  }
}

namespace {

// Attention at a model's sizes in double: o and, from go, the gradients by the backward's
// formulas (the small cases above check those against finite differences). q [T, H*Dh],
// k, v [T, KV*Dh]; a window and, optionally, documents.
struct AttentionRef64 {
  int64_t seqs, S, H, KV, Dh, window;
  double scale, softcap;
  std::vector<int32_t> doc_start;  // [seqs * S] or empty
  D o, gq, gk, gv;
  void run(const D& q, const D& k, const D& v, const D& go) {
    const int64_t Q = H * Dh, KVW = KV * Dh, group = H / KV;
    o.assign(q.size(), 0.0);
    gq.assign(q.size(), 0.0);
    gk.assign(k.size(), 0.0);
    gv.assign(v.size(), 0.0);
    for (int64_t s = 0; s < seqs; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / group;
        auto Qa = [&](int64_t i, int64_t d) { return q[(s * S + i) * Q + h * Dh + d]; };
        auto Ka = [&](int64_t j, int64_t d) { return k[(s * S + j) * KVW + g * Dh + d]; };
        auto Va = [&](int64_t j, int64_t d) { return v[(s * S + j) * KVW + g * Dh + d]; };
        auto dO = [&](int64_t i, int64_t d) { return go[(s * S + i) * Q + h * Dh + d]; };
        for (int64_t i = 0; i < S; ++i) {
          int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
          if (!doc_start.empty()) first = std::max<int64_t>(first, doc_start[s * S + i]);
          D p(static_cast<size_t>(S), 0.0), t(static_cast<size_t>(S), 0.0);
          double m = -1e300, z = 0;
          for (int64_t j = first; j <= i; ++j) {
            double sc = 0;
            for (int64_t d = 0; d < Dh; ++d) sc += Qa(i, d) * Ka(j, d);
            p[j] = sc * scale;
            if (softcap > 0) p[j] = softcap * (t[j] = std::tanh(p[j] / softcap));
            m = std::max(m, p[j]);
          }
          for (int64_t j = first; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
          for (int64_t j = first; j <= i; ++j) p[j] /= z;
          double rowdot = 0;
          for (int64_t d = 0; d < Dh; ++d) {
            double od = 0;
            for (int64_t j = first; j <= i; ++j) od += p[j] * Va(j, d);
            o[(s * S + i) * Q + h * Dh + d] = od;
            rowdot += od * dO(i, d);
          }
          for (int64_t j = first; j <= i; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < Dh; ++d) {
              dp += dO(i, d) * Va(j, d);
              gv[(s * S + j) * KVW + g * Dh + d] += p[j] * dO(i, d);
            }
            double ds = p[j] * (dp - rowdot);
            if (softcap > 0) ds *= 1 - t[j] * t[j];
            for (int64_t d = 0; d < Dh; ++d) {
              gq[(s * S + i) * Q + h * Dh + d] += scale * ds * Ka(j, d);
              gk[(s * S + j) * KVW + g * Dh + d] += scale * ds * Qa(i, d);
            }
          }
        }
      }
  }
};

}  // namespace

// At a model's sizes against double, with and without a soft-cap, through the host's fused
// kernel (where built), gemm one head at a time and every head at once: head_dim 80 (a
// register tile's columns and a part), 150 positions (three row blocks, the last partial),
// 3 query heads a kv head, a window of 70 and documents starting at 41 and 100 in the
// first sequence; and head_dim 72 over 40 positions (one partial row block: the fused
// kernel's blocks are shorter than 64 rows), 4 query heads of one kv head, no window, a
// document starting at 13 in the second sequence.
TYPED_TEST(LlamaOps, AttentionAtModelSizesAgainstFloat64) {
  using M = typename TypeParam::memory_space;
  struct Case {
    AttentionRef64 ref;
    std::vector<std::pair<int64_t, int32_t>> docs;  // (token, its document's start) a run on
  };
  std::vector<Case> cases = {
      {{2, 150, 6, 2, 80, 70, 0.11, 0, {}, {}, {}, {}, {}}, {{41, 41}, {100, 100}}},
      {{3, 40, 4, 1, 72, 0, 0.12, 0, {}, {}, {}, {}, {}}, {{40 + 13, 13}, {80, 0}}}};
  for (Case& c : cases) {
    AttentionRef64& ref = c.ref;
    const int64_t T = ref.seqs * ref.S, Q = ref.H * ref.Dh, KV = ref.KV * ref.Dh;
    const auto qf = nf4test::randn(T * Q, 31, 1.5f), kf = nf4test::randn(T * KV, 32, 1.5f),
               vf = nf4test::randn(T * KV, 33), gf = nf4test::randn(T * Q, 34);
    auto q = matrix<M>(qf, T, Q), k = matrix<M>(kf, T, KV), v = matrix<M>(vf, T, KV);
    auto go = matrix<M>(gf, T, Q);
    // Each listed token starts a run of tokens whose document starts at the given position
    // (up to the next listed token); tokens before the first: their row's position 0.
    ref.doc_start.assign(static_cast<size_t>(T), 0);
    for (size_t r = 0; r < c.docs.size(); ++r) {
      const int64_t end = r + 1 < c.docs.size() ? c.docs[r + 1].first : T;
      for (int64_t t = c.docs[r].first; t < end; ++t)
        ref.doc_start[t] = t / ref.S == c.docs[r].first / ref.S ? c.docs[r].second : 0;
    }
    Kokkos::View<int32_t**, Kokkos::LayoutRight, M> docs("docs", ref.seqs, ref.S);
    {
      auto hd = Kokkos::create_mirror_view(docs);
      for (int64_t t = 0; t < T; ++t) hd(t / ref.S, t % ref.S) = ref.doc_start[t];
      Kokkos::deep_copy(docs, hd);
    }
    for (const double cap : {0.0, 2.0}) {
      ref.softcap = cap;
      ref.run(widen(qf), widen(kf), widen(vf), widen(gf));
      for (int mode = 0; mode < 3; ++mode) {
        kqlora::AttentionWorkspace<M> ws;
        ws.fused_host = mode == 0;
        ws.batch_heads = mode == 2;
        kqlora::AttentionShape shape{ref.seqs, ref.S, ref.H, ref.KV, ref.Dh};
        shape.attn_scale = static_cast<float>(ref.scale);
        shape.softcap = static_cast<float>(cap);
        shape.window = ref.window;
        kqlora::Matrix<M> o("o", T, Q), gq("gq", T, Q), gk("gk", T, KV), gv("gv", T, KV);
        Kokkos::View<float*, M> lse("lse", ref.seqs * ref.H * ref.S);
        kqlora::causal_attention_forward(TypeParam(), shape, q, k, v, false, ws, o, lse,
                                         kqlora::DocStarts<M>(docs));
        kqlora::causal_attention_backward(TypeParam(), shape, q, k, v, o, lse, go, false, ws, gq,
                                          gk, gv, kqlora::DocStarts<M>(docs));
        const bool fused = kqlora::impl::takes_fused_host_attention(ws, false);
        const std::string tag = " S " + std::to_string(ref.S) + (cap > 0 ? " soft-capped" : "") +
                                (fused       ? " (fused)"
                                 : mode == 2 ? " (heads at once)"
                                             : " (gemm)");
        expect_close(host(o), ref.o, 2e-6, "o" + tag);
        expect_close(host(gq), ref.gq, 1e-5, "dq" + tag);
        expect_close(host(gk), ref.gk, 1e-5, "dk" + tag);
        expect_close(host(gv), ref.gv, 1e-5, "dv" + tag);
      }
    }
  }
}
