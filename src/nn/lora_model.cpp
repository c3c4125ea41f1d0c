#include "kqlora/nn/lora_model.hpp"

#include "kqlora/core/kokkos_compat.hpp"

namespace kqlora {

Activation parse_activation(const std::string& s) {
  if (s == "relu") return Activation::relu;
  if (s == "gelu") return Activation::gelu;
  if (s == "silu") return Activation::silu;
  KQLORA_INPUT_CHECK(s == "none", "activation: expected none|relu|gelu|silu, got '" << s << "'");
  return Activation::none;
}

template <class ExecSpace>
std::string LoraModel<ExecSpace>::base_name(int layer) {
  return "layers." + std::to_string(layer) + ".weight";
}

template <class ExecSpace>
LoraModel<ExecSpace>::LoraModel(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed)
    : exec_(exec), cfg_(cfg) {
  const int64_t d = cfg.dim, r = cfg.rank;
  int64_t offset = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    info_.push_back({p + "lora_a.weight", {r, d}, offset, r * d});
    offset += r * d;
    info_.push_back({p + "lora_b.weight", {d, r}, offset, d * r});
    offset += d * r;
    if (cfg.bias) {
      info_.push_back({p + "bias", {d}, offset, d});
      offset += d;
    }
  }
  auto alloc = [&](const char* label) {
    return zeroed
               ? Vec(std::string(label), offset)
               : Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), offset);
  };
  params = alloc("kqlora::LoraModel::params");
  grads = alloc("kqlora::LoraModel::grads");
  compute_ = cfg.bf16() ? Vec("kqlora::LoraModel::params_bf16", offset) : params;
  base.resize(cfg.num_layers);
  cache_.resize(cfg.num_layers);
}

template <class ExecSpace>
const ParamInfo& LoraModel<ExecSpace>::param(const std::string& name) const {
  for (const auto& p : info_)
    if (p.name == name) return p;
  KQLORA_CHECK(false, "no parameter named '" << name << "'");
}

template <class ExecSpace>
int64_t LoraModel<ExecSpace>::base_bytes() const {
  int64_t n = 0;
  for (const auto& b : base) n += b.storage_bytes();
  return n;
}

template <class ExecSpace>
void LoraModel<ExecSpace>::use_buffers(const Vec& new_params, const Vec& new_grads) {
  KQLORA_CHECK(
      !(new_params.extent(0) != params.extent(0) || new_grads.extent(0) != grads.extent(0)),
      "LoraModel::use_buffers: buffers of the wrong size");
  const bool same = compute_.data() == params.data();
  params = new_params;
  grads = new_grads;
  if (same) compute_ = params;  // float32: forward and backward read the masters
}

template <class ExecSpace>
void LoraModel<ExecSpace>::params_changed() {
  if (!cfg_.bf16()) return;
  auto src = params;
  auto dst = compute_;
  Kokkos::parallel_for(
      "kqlora::LoraModel::round_params",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec_, 0, params.extent(0)),
      KOKKOS_LAMBDA(int64_t i) { dst(i) = round_to_bf16(src(i)); });
}

template <class ExecSpace>
Matrix<typename ExecSpace::memory_space> LoraModel<ExecSpace>::a_of(const Vec& v, int l) const {
  return Matrix<Mem>(v.data() + info_[l * (cfg_.bias ? 3 : 2)].offset, cfg_.rank, cfg_.dim);
}

template <class ExecSpace>
Matrix<typename ExecSpace::memory_space> LoraModel<ExecSpace>::b_of(const Vec& v, int l) const {
  return Matrix<Mem>(v.data() + info_[l * (cfg_.bias ? 3 : 2) + 1].offset, cfg_.dim, cfg_.rank);
}

template <class ExecSpace>
Kokkos::View<float*, typename ExecSpace::memory_space> LoraModel<ExecSpace>::bias(const Vec& v,
                                                                                  int l) const {
  return Kokkos::View<float*, Mem>(v.data() + info_[l * 3 + 2].offset, cfg_.dim);
}

template <class ExecSpace>
nn::DropoutKey LoraModel<ExecSpace>::dropout_key(int layer) const {
  return {cfg_.seed,     layer_stream(RandomStream::dropout, layer),
          step_,         global_bs_,
          first_sample_, cfg_.dim,
          cfg_.dropout};
}

namespace {
// A [T, cols] matrix over the start of a flat buffer (its first T rows).
template <class Mem>
Matrix<Mem> head(const Kokkos::View<float*, Mem>& buf, int64_t T, int64_t cols) {
  return Matrix<Mem>(buf.data(), T, cols);
}
}  // namespace

template <class ExecSpace>
void LoraModel<ExecSpace>::ensure_tokens(int64_t T) {
  const int64_t d = cfg_.dim, r = cfg_.rank;
  if (T > tokens_) {
    // Owned flat buffers, sized for T; the matrices below are views of their heads.
    auto alloc = [](const char* label, int64_t n) {
      return Vec(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
    };
    buffers_.clear();
    for (int l = 0; l < cfg_.num_layers; ++l) {
      buffers_.push_back(alloc("kqlora::LoraModel::z", T * d));
      buffers_.push_back(alloc("kqlora::LoraModel::h", T * r));
      buffers_.push_back(l > 0 && cfg_.activation != Activation::none
                             ? alloc("kqlora::LoraModel::x", T * d)
                             : Vec());
      buffers_.push_back(cfg_.dropout > 0 ? alloc("kqlora::LoraModel::xd", T * d) : Vec());
    }
    // Scratch: tmp only where bfloat16 rounding or dropout needs a separate product.
    buffers_.push_back(cfg_.bf16() || cfg_.dropout > 0 ? alloc("kqlora::LoraModel::tmp", T * d)
                                                       : Vec());
    buffers_.push_back(alloc("kqlora::LoraModel::g", T * d));
    buffers_.push_back(alloc("kqlora::LoraModel::gh", T * r));
    tokens_ = T;
  }
  const size_t n = buffers_.size();
  if (buffers_[n - 3].data()) tmp_ = head(buffers_[n - 3], T, d);
  g_a_ = head(buffers_[n - 2], T, d);
  gh_ = head(buffers_[n - 1], T, r);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    cache_[l].z = head(buffers_[4 * l], T, d);
    cache_[l].h = head(buffers_[4 * l + 1], T, r);
    if (buffers_[4 * l + 2].data()) cache_[l].x = head(buffers_[4 * l + 2], T, d);
    if (buffers_[4 * l + 3].data()) cache_[l].xd = head(buffers_[4 * l + 3], T, d);
  }
}

template <class ExecSpace>
Matrix<typename ExecSpace::memory_space> LoraModel<ExecSpace>::forward(const Matrix<Mem>& x,
                                                                       int64_t step,
                                                                       int64_t first_sample,
                                                                       int64_t global_bs) {
  const int64_t T = x.extent(0);
  KQLORA_CHECK(static_cast<int64_t>(x.extent(1)) == cfg_.dim,
               "LoraModel::forward: input has " << x.extent(1) << " features, dim is " << cfg_.dim);
  ensure_tokens(T);
  step_ = step;
  first_sample_ = first_sample;
  global_bs_ = global_bs;
  const bool bf16 = cfg_.bf16();
  const float s = cfg_.scale();
  const int L = static_cast<int>(cfg_.num_layers);
  for (int l = 0; l < L; ++l) {
    LayerCache& c = cache_[l];
    if (l == 0) c.x = x;
    if (cfg_.dropout > 0) {
      nn::dropout_apply(exec_, dropout_key(l), bf16, c.x, c.xd, 0.0f);
    } else {
      c.xd = c.x;
    }
    gemm(exec_, "N", "T", 1.0f, c.xd, a_of(compute_, l), 0.0f, c.h);  // h = x_d A^T
    if (bf16) nn::round_bf16(exec_, c.h);
    if (acquire_base_) acquire_base_(l);
    linear_nf4_forward(exec_, base[l], c.x, c.z, ws_);  // z = x W^T
    if (release_base_) release_base_(l);
    if (bf16) nn::round_bf16(exec_, c.z);
    if (cfg_.bias)
      nn::add_bias(exec_, Kokkos::View<const float*, Mem>(bias(compute_, l)), bf16, c.z);
    if (bf16) {  // PyTorch: out + lora_b(h) * scaling, each rounded
      gemm(exec_, "N", "T", 1.0f, c.h, b_of(compute_, l), 0.0f, tmp_);
      nn::round_bf16(exec_, tmp_);
      nn::add_scaled_bf16(exec_, s, tmp_, c.z);
    } else {
      gemm(exec_, "N", "T", s, c.h, b_of(compute_, l), 1.0f, c.z);  // z += s h B^T
    }
    if (l + 1 < L) {
      if (cfg_.activation == Activation::none) {
        cache_[l + 1].x = c.z;
      } else {
        nn::activation_forward(exec_, cfg_.activation, bf16, c.z, cache_[l + 1].x);
      }
    }
  }
  return cache_[L - 1].z;
}

template <class ExecSpace>
void LoraModel<ExecSpace>::backward(const Matrix<Mem>& gy, bool accumulate) {
  const bool bf16 = cfg_.bf16();
  const float beta = accumulate ? 1.0f : 0.0f;  // (0 + x and x: the same bits)
  const float s = cfg_.scale();
  const int L = static_cast<int>(cfg_.num_layers);
  Matrix<Mem> g = gy;
  for (int l = L - 1; l >= 0; --l) {
    LayerCache& c = cache_[l];
    if (l + 1 < L && cfg_.activation != Activation::none)
      nn::activation_backward(exec_, cfg_.activation, bf16, c.z, g);
    gemm(exec_, "T", "N", s, g, c.h, beta, b_of(grads, l));  // dB += s g^T h
    if (cfg_.bias) nn::accumulate_bias_grad(exec_, g, bias(grads, l), accumulate);
    gemm(exec_, "N", "N", s, g, b_of(compute_, l), 0.0f, gh_);  // gh = s g B
    if (bf16) nn::round_bf16(exec_, gh_);
    gemm(exec_, "T", "N", 1.0f, gh_, c.xd, beta, a_of(grads, l));  // dA += gh^T x_d
    if (layer_done_) {
      fence(exec_, "kqlora::LoraModel::layer_grads");  // in memory before anyone sends them
      layer_done_(l);
    }
    if (l == 0) break;  // the input needs no gradient
    // Input gradients alternate between g_a_ and the caller's gy, done with after layer L-1.
    Matrix<Mem> gx = g.data() == g_a_.data() ? gy : g_a_;
    if (acquire_base_) acquire_base_(l);
    linear_nf4_backward(exec_, base[l], g, gx, ws_);  // gx = g W
    if (release_base_) release_base_(l);
    if (cfg_.dropout > 0) {
      gemm(exec_, "N", "N", 1.0f, gh_, a_of(compute_, l), 0.0f, tmp_);  // gh A
      if (bf16) nn::round_bf16(exec_, tmp_);
      nn::dropout_apply(exec_, dropout_key(l), false, tmp_, gx, 1.0f);
    } else {
      gemm(exec_, "N", "N", 1.0f, gh_, a_of(compute_, l), 1.0f, gx);  // gx += gh A
    }
    if (bf16) nn::round_bf16(exec_, gx);
    g = gx;
  }
}

template <class ExecSpace>
void LoraModel<ExecSpace>::set_backward_hooks(std::function<void(int)> layer_done,
                                              std::function<void()> progress) {
  layer_done_ = std::move(layer_done);
  ws_.between_panels = std::move(progress);
}

template <class ExecSpace>
void LoraModel<ExecSpace>::set_base_hooks(std::function<void(int)> acquire,
                                          std::function<void(int)> release) {
  acquire_base_ = std::move(acquire);
  release_base_ = std::move(release);
}

template class LoraModel<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
