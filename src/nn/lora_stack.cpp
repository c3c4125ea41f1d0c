#include "kqlora/nn/lora_stack.hpp"

#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/loss.hpp"

namespace kqlora {

template <class ExecSpace>
ParamTable LoraStack<ExecSpace>::make_table(const ModelConfig& cfg) {
  const int64_t d = cfg.dim, r = cfg.rank;
  using Dist = InitRule::Dist;
  ParamTable t;
  t.model_kind = cfg.kind;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string g = "layers." + std::to_string(l), p = g + ".";
    ParamEntry e;
    e.name = p + "lora_a.weight";
    e.shape = {r, d};
    e.init = {Dist::uniform, d, layer_stream(RandomStream::lora_a, l)};
    t.add(e, g);
    e.name = p + "lora_b.weight";
    e.shape = {d, r};
    e.init = {cfg.lora_b_zeros ? Dist::zeros : Dist::uniform, r,
              layer_stream(RandomStream::lora_b, l)};
    t.add(e, g);
    if (cfg.bias) {  // nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
      e.name = p + "bias";
      e.shape = {d};
      e.init = {Dist::uniform, d, layer_stream(RandomStream::bias, l)};
      t.add(e, g);
    }
    e.name = p + "weight";
    e.shape = {d, d};
    e.kind = ParamKind::nf4;
    e.dtype = cfg.dtype;
    e.block_size = cfg.block_size;
    e.scaler_block_size = cfg.scaler_block_size;
    e.init = {Dist::normal, d, layer_stream(RandomStream::base_weight, l)};
    t.add(e, g);
    t.adapters.push_back(
        {g, p + "weight", p + "lora_a.weight", p + "lora_b.weight", cfg.alpha, r, cfg.dropout});
  }
  return t;
}

template <class ExecSpace>
LoraStack<ExecSpace>::LoraStack(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed)
    : Model<ExecSpace>(exec, cfg, make_table(cfg), zeroed) {
  const ParamTable& t = this->table_;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    layers_.push_back({&t.at(p + "lora_a.weight"), &t.at(p + "lora_b.weight"),
                       cfg.bias ? &t.at(p + "bias") : nullptr, &t.at(p + "weight")});
  }
  cache_.resize(cfg.num_layers);
  ws_.between_panels = [this] {
    if (this->progress_) this->progress_();
  };
}

template <class ExecSpace>
InputSpec LoraStack<ExecSpace>::input() const {
  InputSpec s;
  s.features = this->cfg_.dim;
  s.target_features = this->cfg_.loss == LossKind::mse ? this->cfg_.dim : 0;
  return s;
}

template <class ExecSpace>
DropoutKey LoraStack<ExecSpace>::dropout_key(int layer) const {
  return {
      this->cfg_.seed, layer_stream(RandomStream::dropout, layer), step_, global_bs_, first_sample_,
      this->cfg_.dim,  static_cast<float>(this->cfg_.dropout)};
}

namespace {
// A [T, cols] matrix over the start of a flat buffer (its first T rows).
template <class Mem>
Matrix<Mem> head(const Kokkos::View<float*, Mem>& buf, int64_t T, int64_t cols) {
  return Matrix<Mem>(buf.data(), T, cols);
}
}  // namespace

template <class ExecSpace>
void LoraStack<ExecSpace>::ensure_tokens(int64_t T) {
  const ModelConfig& cfg = this->cfg_;
  const int64_t d = cfg.dim, r = cfg.rank;
  if (T > tokens_) {
    // Owned flat buffers, sized for T; the matrices below are views of their heads.
    auto alloc = [](const char* label, int64_t n) {
      return Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
    };
    buffers_.clear();
    for (int l = 0; l < cfg.num_layers; ++l) {
      buffers_.push_back(alloc("kqlora::LoraStack::z", T * d));
      buffers_.push_back(alloc("kqlora::LoraStack::h", T * r));
      buffers_.push_back(l > 0 && cfg.activation != Activation::none
                             ? alloc("kqlora::LoraStack::x", T * d)
                             : Vec());
      buffers_.push_back(cfg.dropout > 0 ? alloc("kqlora::LoraStack::xd", T * d) : Vec());
    }
    // Scratch: tmp only where bfloat16 rounding or dropout needs a separate product.
    buffers_.push_back(cfg.bf16() || cfg.dropout > 0 ? alloc("kqlora::LoraStack::tmp", T * d)
                                                     : Vec());
    buffers_.push_back(alloc("kqlora::LoraStack::g", T * d));
    buffers_.push_back(alloc("kqlora::LoraStack::gh", T * r));
    buffers_.push_back(alloc("kqlora::LoraStack::gy", T * d));
    tokens_ = T;
  }
  const size_t n = buffers_.size();
  if (buffers_[n - 4].data()) tmp_ = head(buffers_[n - 4], T, d);
  g_a_ = head(buffers_[n - 3], T, d);
  gh_ = head(buffers_[n - 2], T, r);
  gy_ = head(buffers_[n - 1], T, d);
  for (int l = 0; l < cfg.num_layers; ++l) {
    cache_[l].z = head(buffers_[4 * l], T, d);
    cache_[l].h = head(buffers_[4 * l + 1], T, r);
    if (buffers_[4 * l + 2].data()) cache_[l].x = head(buffers_[4 * l + 2], T, d);
    if (buffers_[4 * l + 3].data()) cache_[l].xd = head(buffers_[4 * l + 3], T, d);
  }
}

template <class ExecSpace>
auto LoraStack<ExecSpace>::forward(const Matrix<Mem>& x, int64_t step, int64_t first_sample,
                                   int64_t global_bs, bool training) -> Matrix<Mem> {
  const ModelConfig& cfg = this->cfg_;
  const ExecSpace& exec = this->exec_;
  const int64_t T = x.extent(0);
  KQLORA_CHECK(static_cast<int64_t>(x.extent(1)) == cfg.dim,
               "LoraStack::forward: input has " << x.extent(1) << " features, dim is " << cfg.dim);
  ensure_tokens(T);
  step_ = step;
  first_sample_ = first_sample;
  global_bs_ = global_bs;
  dropout_on_ = training && cfg.dropout > 0;
  const bool bf16 = cfg.bf16();
  const float s = cfg.scale();
  const int L = static_cast<int>(cfg.num_layers);
  for (int l = 0; l < L; ++l) {
    LayerCache& c = cache_[l];
    const Layer& P = layers_[l];
    if (l == 0) c.x = x;
    if (dropout_on_) {
      dropout_apply(exec, dropout_key(l), bf16, c.x, c.xd, 0.0f);
    } else {
      c.xd = c.x;
    }
    gemm(exec, "N", "T", 1.0f, c.xd, this->matrix(this->compute_, *P.a), 0.0f, c.h);  // h = x_d A^T
    if (bf16) round_bf16(exec, c.h);
    this->acquire(P.weight->group);
    linear_nf4_forward(exec, base(l), c.x, c.z, ws_);  // z = x W^T
    this->release(P.weight->group);
    if (bf16) round_bf16(exec, c.z);
    if (P.bias)
      add_bias(exec, Kokkos::View<const float*, Mem>(this->vector(this->compute_, *P.bias)), bf16,
               c.z);
    if (bf16) {  // PyTorch: out + lora_b(h) * scaling, each rounded
      gemm(exec, "N", "T", 1.0f, c.h, this->matrix(this->compute_, *P.b), 0.0f, tmp_);
      round_bf16(exec, tmp_);
      add_scaled_bf16(exec, s, tmp_, c.z);
    } else {
      gemm(exec, "N", "T", s, c.h, this->matrix(this->compute_, *P.b), 1.0f, c.z);  // z += s h B^T
    }
    if (l + 1 < L) {
      if (cfg.activation == Activation::none) {
        cache_[l + 1].x = c.z;
      } else {
        activation_forward(exec, cfg.activation, bf16, c.z, cache_[l + 1].x);
      }
    }
  }
  return cache_[L - 1].z;
}

template <class ExecSpace>
void LoraStack<ExecSpace>::backward(const Matrix<Mem>& gy, bool accumulate) {
  const ModelConfig& cfg = this->cfg_;
  const ExecSpace& exec = this->exec_;
  const bool bf16 = cfg.bf16();
  const float beta = accumulate ? 1.0f : 0.0f;  // (0 + x and x: the same bits)
  const float s = cfg.scale();
  const int L = static_cast<int>(cfg.num_layers);
  const Vec& grads = this->grads;
  Matrix<Mem> g = gy;
  for (int l = L - 1; l >= 0; --l) {
    LayerCache& c = cache_[l];
    const Layer& P = layers_[l];
    if (l + 1 < L && cfg.activation != Activation::none)
      activation_backward(exec, cfg.activation, bf16, c.z, g);
    gemm(exec, "T", "N", s, g, c.h, beta, this->matrix(grads, *P.b));  // dB += s g^T h
    if (P.bias) accumulate_bias_grad(exec, g, this->vector(grads, *P.bias), accumulate);
    gemm(exec, "N", "N", s, g, this->matrix(this->compute_, *P.b), 0.0f, gh_);  // gh = s g B
    if (bf16) round_bf16(exec, gh_);
    gemm(exec, "T", "N", 1.0f, gh_, c.xd, beta, this->matrix(grads, *P.a));  // dA += gh^T x_d
    this->group_done(P.a->group);
    if (l == 0) break;  // the input needs no gradient
    // Input gradients alternate between g_a_ and the caller's gy, done with after layer L-1.
    Matrix<Mem> gx = g.data() == g_a_.data() ? gy : g_a_;
    this->acquire(P.weight->group);
    linear_nf4_backward(exec, base(l), g, gx, ws_);  // gx = g W
    this->release(P.weight->group);
    if (dropout_on_) {
      gemm(exec, "N", "N", 1.0f, gh_, this->matrix(this->compute_, *P.a), 0.0f, tmp_);  // gh A
      if (bf16) round_bf16(exec, tmp_);
      dropout_apply(exec, dropout_key(l), false, tmp_, gx, 1.0f);
    } else {
      gemm(exec, "N", "N", 1.0f, gh_, this->matrix(this->compute_, *P.a), 1.0f, gx);  // gx += gh A
    }
    if (bf16) round_bf16(exec, gx);
    g = gx;
  }
}

template <class ExecSpace>
double LoraStack<ExecSpace>::forward_backward(const Batch<Mem>& b, double normaliser,
                                              bool accumulate) {
  auto y = forward(b.inputs, b.step, b.first_sample, b.global_bs, true);
  const double loss =
      loss_forward_backward(this->exec_, this->cfg_.loss, y, b.targets, normaliser, gy_);
  backward(gy_, accumulate);
  return loss;
}

template <class ExecSpace>
double LoraStack<ExecSpace>::loss(const Batch<Mem>& b, double normaliser) {
  auto y = forward(b.inputs, b.step, b.first_sample, b.global_bs, false);
  return loss_value(this->exec_, this->cfg_.loss, y, b.targets, normaliser);
}

template class LoraStack<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
