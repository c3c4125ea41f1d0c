// A second model, known only to this test: it proves the model interface (nn/model.hpp)
// carries a model that is not the seed's stack. Token ids in; a frozen dense embedding
// (group "embed", replicated); a block (group "block") of two rectangular NF4 weights,
// up [2H, H] with a LoRA adapter and down [H, 2H], silu between them; a trainable float32
// head [V, H] with a bias [V] (group "head"); next-token cross-entropy (labels[t + 1]
// scored at t, -100 ignored) divided by the normaliser. Registered as model kind "test_token_mlp":
// the trainer, DDP, FSDP, checkpoints and restarts reach it through the table and the interface
// only.

#include "token_mlp_model.hpp"

#include <cmath>

#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/linear_nf4.hpp"
#include "kqlora/nn/model_registry.hpp"

namespace tokenmlp {

using kqlora::Matrix;
using kqlora::ParamEntry;
using kqlora::ParamKind;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

kqlora::ParamTable make_table(const kqlora::ModelConfig& cfg) {
  const int64_t H = cfg.dim, r = cfg.rank;
  using Dist = kqlora::InitRule::Dist;
  kqlora::ParamTable t;
  t.model_kind = cfg.kind;
  ParamEntry e;
  e.name = "embed.weight";
  e.shape = {kVocab, H};
  e.kind = ParamKind::dense;
  e.init = {Dist::normal, H, kqlora::layer_stream(kqlora::RandomStream::base_weight, 100)};
  t.add(e, "embed");
  e.kind = ParamKind::nf4;
  e.block_size = cfg.block_size;
  e.scaler_block_size = cfg.scaler_block_size;
  e.name = "block.up.weight";
  e.shape = {2 * H, H};
  e.init.stream = kqlora::layer_stream(kqlora::RandomStream::base_weight, 0);
  t.add(e, "block");
  e.name = "block.down.weight";
  e.shape = {H, 2 * H};
  e.init.stream = kqlora::layer_stream(kqlora::RandomStream::base_weight, 1);
  t.add(e, "block");
  e = ParamEntry();
  e.name = "block.up.lora_a.weight";
  e.shape = {r, H};
  e.init = {Dist::uniform, H, kqlora::layer_stream(kqlora::RandomStream::lora_a, 0)};
  t.add(e, "block");
  e.name = "block.up.lora_b.weight";
  e.shape = {2 * H, r};
  e.init = {Dist::uniform, r, kqlora::layer_stream(kqlora::RandomStream::lora_b, 0)};
  t.add(e, "block");
  e.name = "head.weight";
  e.shape = {kVocab, H};
  e.init = {Dist::uniform, H, kqlora::layer_stream(kqlora::RandomStream::bias, 0)};
  t.add(e, "head");
  e.name = "head.bias";
  e.shape = {kVocab};
  e.init = {Dist::uniform, H, kqlora::layer_stream(kqlora::RandomStream::bias, 1)};
  t.add(e, "head");
  t.adapters.push_back({"block.up", "block.up.weight", "block.up.lora_a.weight",
                        "block.up.lora_b.weight", cfg.alpha, r, cfg.dropout});
  return t;
}

namespace {

class TokenMlp : public kqlora::Model<Exec> {
 public:
  TokenMlp(const Exec& exec, const kqlora::ModelConfig& cfg, bool zeroed)
      : Model(exec, cfg, make_table(cfg), zeroed) {
    ws_.between_panels = [this] {
      if (progress_) progress_();
    };
  }

  kqlora::InputSpec input() const override {
    kqlora::InputSpec s;
    s.tokens = true;
    s.seq_len = kSeqLen;
    s.vocab = kVocab;
    return s;
  }

  double forward_backward(const kqlora::Batch<Mem>& b, double normaliser,
                          bool accumulate) override {
    const double loss = forward(b, normaliser, true);
    backward(accumulate);
    return loss;
  }
  double loss(const kqlora::Batch<Mem>& b, double normaliser) override {
    return forward(b, normaliser, false);
  }

 private:
  kqlora::LinearNf4Workspace<Mem> ws_;
  Matrix<Mem> x_, h_, u_, a_, y_, logits_, gu_, gy_, gh_;

  const ParamEntry& e(const char* name) const { return table_.at(name); }
  Matrix<Mem> p(const char* name) const { return matrix(params, e(name)); }
  Matrix<Mem> g(const char* name) const { return matrix(grads, e(name)); }

 public:  // (nvcc: a function with device lambdas may not be private)
  double forward(const kqlora::Batch<Mem>& b, double normaliser, bool with_grads) {
    const int64_t n = b.tokens.extent(0), S = kSeqLen, T = n * S, H = cfg_.dim, r = cfg_.rank;
    const int64_t V = kVocab;
    if (static_cast<int64_t>(x_.extent(0)) != T) {
      x_ = Matrix<Mem>("tokenmlp::x", T, H);
      h_ = Matrix<Mem>("tokenmlp::h", T, r);
      u_ = Matrix<Mem>("tokenmlp::u", T, 2 * H);
      a_ = Matrix<Mem>("tokenmlp::a", T, 2 * H);
      y_ = Matrix<Mem>("tokenmlp::y", T, H);
      logits_ = Matrix<Mem>("tokenmlp::logits", T, V);
      gu_ = Matrix<Mem>("tokenmlp::gu", T, 2 * H);
      gy_ = Matrix<Mem>("tokenmlp::gy", T, H);
      gh_ = Matrix<Mem>("tokenmlp::gh", T, r);
    }
    const auto emb = dense[e("embed.weight").offset];
    const auto ids = b.tokens;
    const auto x = x_;
    Kokkos::parallel_for(
        "tokenmlp::embed", kqlora::over(exec_, T, H),
        KOKKOS_LAMBDA(int64_t t, int64_t f) { x(t, f) = emb(ids(t / S, t % S) * H + f); });
    const float s = cfg_.scale();
    kqlora::gemm(exec_, "N", "T", 1.0f, x_, p("block.up.lora_a.weight"), 0.0f, h_);  // h = x A^T
    acquire(e("block.up.weight").group);
    kqlora::linear_nf4_forward(exec_, nf4[e("block.up.weight").offset], x_, u_, ws_);
    kqlora::gemm(exec_, "N", "T", s, h_, p("block.up.lora_b.weight"), 1.0f, u_);  // += s h B^T
    kqlora::activation_forward(exec_, kqlora::Activation::silu, false, u_, a_);
    kqlora::linear_nf4_forward(exec_, nf4[e("block.down.weight").offset], a_, y_, ws_);
    release(e("block.up.weight").group);
    kqlora::gemm(exec_, "N", "T", 1.0f, y_, p("head.weight"), 0.0f, logits_);
    kqlora::add_bias(exec_, Kokkos::View<const float*, Mem>(vector(params, e("head.bias"))), false,
                     logits_);
    // Next-token cross-entropy; with_grads: logits_ becomes dL/dlogits.
    const auto lg = logits_;
    const auto labels = b.labels;
    const double inv = 1.0 / normaliser;
    double loss = 0;
    Kokkos::parallel_reduce(
        "tokenmlp::cross_entropy",
        Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(exec_, 0, T),
        KOKKOS_LAMBDA(int64_t t, double& acc) {
          const int64_t pos = t % S;
          const int32_t label = pos + 1 < S ? labels(t / S, pos + 1) : kqlora::kIgnoreLabel;
          if (label == kqlora::kIgnoreLabel) {
            if (with_grads)
              for (int64_t v = 0; v < V; ++v) lg(t, v) = 0.0f;
            return;
          }
          float m = lg(t, 0);
          for (int64_t v = 1; v < V; ++v) m = lg(t, v) > m ? lg(t, v) : m;
          double z = 0;
          for (int64_t v = 0; v < V; ++v) z += ::exp(static_cast<double>(lg(t, v) - m));
          acc += ::log(z) + m - lg(t, label);
          if (with_grads)
            for (int64_t v = 0; v < V; ++v)
              lg(t, v) = static_cast<float>(
                  (::exp(static_cast<double>(lg(t, v) - m)) / z - (v == label ? 1.0 : 0.0)) * inv);
        },
        loss);
    return loss * inv;
  }

  void backward(bool accumulate) {
    const float beta = accumulate ? 1.0f : 0.0f, s = cfg_.scale();
    kqlora::gemm(exec_, "T", "N", 1.0f, logits_, y_, beta, g("head.weight"));  // dWh
    kqlora::accumulate_bias_grad(exec_, logits_, vector(grads, e("head.bias")), accumulate);
    group_done(e("head.weight").group);
    kqlora::gemm(exec_, "N", "N", 1.0f, logits_, p("head.weight"), 0.0f, gy_);  // dY
    acquire(e("block.up.weight").group);
    kqlora::linear_nf4_backward(exec_, nf4[e("block.down.weight").offset], gy_, gu_, ws_);
    release(e("block.up.weight").group);
    kqlora::activation_backward(exec_, kqlora::Activation::silu, false, u_, gu_);  // dU
    kqlora::gemm(exec_, "T", "N", s, gu_, h_, beta, g("block.up.lora_b.weight"));  // dB
    kqlora::gemm(exec_, "N", "N", s, gu_, p("block.up.lora_b.weight"), 0.0f, gh_);
    kqlora::gemm(exec_, "T", "N", 1.0f, gh_, x_, beta, g("block.up.lora_a.weight"));  // dA
    group_done(e("block.up.weight").group);
    // (the embedding is frozen: no input gradient)
  }
};

}  // namespace

void register_token_mlp() {
  kqlora::register_model("test_token_mlp",
                         {make_table,
                          [](const Exec& exec, const kqlora::ModelConfig& cfg,
                             bool zeroed) -> std::unique_ptr<kqlora::DefaultModel> {
                            return std::make_unique<TokenMlp>(exec, cfg, zeroed);
                          },
                          {"dim", "lora_rank", "lora_alpha", "lora_dropout", "block_size",
                           "scaler_block_size", "dtype", "seed"}});
}

}  // namespace tokenmlp
