#include "kqlora/nn/llama.hpp"

#include <algorithm>
#include <sstream>
#include <type_traits>

#include "kqlora/core/error.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/embedding.hpp"
#include "kqlora/nn/residual.hpp"
#include "kqlora/nn/rms_norm.hpp"
#include "kqlora/nn/swiglu.hpp"

namespace kqlora {

const std::array<const char*, kLlamaProjections> kLlamaProjectionNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
const std::array<const char*, kLlamaProjections> kLlamaProjectionModules = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

namespace {
enum Proj { kQ, kK, kV, kO, kGate, kUp, kDown };
}  // namespace

std::array<int64_t, 2> projection_shape(const LlamaArch& a, int p) {
  switch (p) {
    case kQ:
      return {a.q_features(), a.hidden};
    case kK:
    case kV:
      return {a.kv_features(), a.hidden};
    case kO:
      return {a.hidden, a.q_features()};
    case kDown:
      return {a.hidden, a.intermediate};
    default:
      return {a.intermediate, a.hidden};
  }
}

double llama_train_flops(const LlamaArch& a, int64_t rank,
                         const std::array<bool, kLlamaProjections>& targets, int64_t sequences,
                         int64_t positions) {
  const double T = static_cast<double>(sequences * positions), L = static_cast<double>(a.layers);
  double weights = 0, qkv = 0, lora_io = 0;  // per layer
  for (int p = 0; p < kLlamaProjections; ++p) {
    const auto s = projection_shape(a, p);
    weights += static_cast<double>(s[0] * s[1]);
    if (p <= kV) qkv += static_cast<double>(s[0] * s[1]);
    if (targets[p]) lora_io += static_cast<double>(s[0] + s[1]);
  }
  // Forward and input gradient of every projection (none into layer 0's input) and of the
  // LM head; 6 rank-r products per adapter; the causal attention's useful products (3
  // forward-and-backward pairs of QK^T and PV sized matmuls over the (query, key) pairs).
  const double projections = 2 * T * (2 * L * weights - qkv);
  const double head = 2 * T * 2 * static_cast<double>(a.vocab * a.hidden);
  const double pairs = static_cast<double>(sequences) * static_cast<double>(positions) *
                       static_cast<double>(positions + 1) / 2.0;
  const double attention =
      L * static_cast<double>(a.heads) * 6 * 2 * pairs * static_cast<double>(a.head_dim);
  const double lora = L * 2 * T * static_cast<double>(rank) * 3 * lora_io;
  return projections + head + attention + lora;
}

namespace {

std::string layer_prefix(int l) {
  return "model.layers." + std::to_string(l);
}

LlamaArch arch_of(const ModelConfig& cfg) {
  KQLORA_INPUT_CHECK(!cfg.arch_text.empty(),
                     "model = llama needs hf_model_dir (a directory with config.json)");
  return parse_llama_config(cfg.arch_text, cfg.arch_source);
}
}  // namespace

std::array<bool, kLlamaProjections> parse_lora_targets(const std::string& text,
                                                       const std::string& where) {
  std::array<bool, kLlamaProjections> on{};
  if (text == "all-linear") {
    on.fill(true);
    return on;
  }
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    const auto it = std::find(kLlamaProjectionNames.begin(), kLlamaProjectionNames.end(), item);
    KQLORA_INPUT_CHECK(it != kLlamaProjectionNames.end(),
                       where << ": '" << item
                             << "' is not a projection; expected all-linear or a comma list of "
                                "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    const size_t p = static_cast<size_t>(it - kLlamaProjectionNames.begin());
    KQLORA_INPUT_CHECK(!on[p], where << ": '" << item << "' is listed twice");
    on[p] = true;
  }
  return on;
}

template <class ExecSpace>
ParamTable Llama<ExecSpace>::make_table(const ModelConfig& cfg) {
  const LlamaArch a = arch_of(cfg);
  const auto targets = parse_lora_targets(cfg.lora_targets, "lora_targets");
  using Dist = InitRule::Dist;
  ParamTable t;
  t.model_kind = cfg.kind;
  ParamEntry dense;
  dense.kind = ParamKind::dense;
  dense.dtype = cfg.dtype;
  dense.init.dist = Dist::file;
  auto add_dense = [&](const std::string& name, std::vector<int64_t> shape, const std::string& g) {
    ParamEntry e = dense;
    e.name = name;
    e.shape = std::move(shape);
    t.add(e, g);
  };
  add_dense("model.embed_tokens.weight", {a.vocab, a.hidden}, "embed");
  for (int l = 0; l < a.layers; ++l) {
    const std::string g = layer_prefix(l);
    for (int p = 0; p < kLlamaProjections; ++p) {  // the adapters first: contiguous per group
      if (!targets[p]) continue;
      const auto s = projection_shape(a, p);
      const std::string m = g + "." + kLlamaProjectionModules[p];
      KQLORA_INPUT_CHECK(cfg.rank >= 1 && cfg.rank <= std::min(s[0], s[1]),
                         "lora_rank " << cfg.rank << " must be between 1 and "
                                      << std::min(s[0], s[1]) << " (the smaller side of " << m
                                      << " [" << s[0] << ", " << s[1] << "])");
      const uint64_t stream = static_cast<uint64_t>(l) * kLlamaProjections + p;
      ParamEntry e;
      e.name = m + ".lora_a.weight";
      e.shape = {cfg.rank, s[1]};
      e.init = {Dist::uniform, s[1], static_cast<uint64_t>(RandomStream::lora_a) + stream};
      t.add(e, g);
      e.name = m + ".lora_b.weight";
      e.shape = {s[0], cfg.rank};
      e.init = {cfg.lora_b_zeros ? Dist::zeros : Dist::uniform, cfg.rank,
                static_cast<uint64_t>(RandomStream::lora_b) + stream};
      t.add(e, g);
      t.adapters.push_back({m, m + ".weight", m + ".lora_a.weight", m + ".lora_b.weight", cfg.alpha,
                            cfg.rank, cfg.dropout});
    }
    for (int p = 0; p < kLlamaProjections; ++p) {
      const auto s = projection_shape(a, p);
      ParamEntry e;
      e.name = g + "." + kLlamaProjectionModules[p] + ".weight";
      e.shape = {s[0], s[1]};
      e.kind = ParamKind::nf4;
      e.dtype = cfg.dtype;
      e.block_size = cfg.block_size;
      e.scaler_block_size = cfg.scaler_block_size;
      e.init.dist = Dist::file;
      t.add(e, g);
    }
    add_dense(g + ".input_layernorm.weight", {a.hidden}, g);
    add_dense(g + ".post_attention_layernorm.weight", {a.hidden}, g);
  }
  add_dense("model.norm.weight", {a.hidden}, "head");
  if (!a.tied) add_dense("lm_head.weight", {a.vocab, a.hidden}, "head");
  return t;
}

template <class ExecSpace>
Llama<ExecSpace>::Llama(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed)
    : Model<ExecSpace>(exec, cfg, make_table(cfg), zeroed), arch_(arch_of(cfg)) {
  const ParamTable& t = this->table_;
  inv_freq_ = rope_inv_freq(arch_);
  targets_ = parse_lora_targets(cfg.lora_targets, "lora_targets");
  for (int l = 0; l < arch_.layers; ++l) {
    const std::string g = layer_prefix(l) + ".";
    Block b;
    for (int p = 0; p < kLlamaProjections; ++p) {
      const std::string m = g + kLlamaProjectionModules[p];
      b.w[p] = &t.at(m + ".weight");
      if (targets_[p]) {
        b.a[p] = &t.at(m + ".lora_a.weight");
        b.b[p] = &t.at(m + ".lora_b.weight");
      }
    }
    b.ln1 = &t.at(g + "input_layernorm.weight");
    b.ln2 = &t.at(g + "post_attention_layernorm.weight");
    blocks_.push_back(b);
  }
  embed_ = &t.at("model.embed_tokens.weight");
  norm_ = &t.at("model.norm.weight");
  head_ = arch_.tied ? embed_ : &t.at("lm_head.weight");
  cache_.resize(static_cast<size_t>(arch_.layers));
  store_.resize(cache_.size());
  ws_.between_panels = [this] {
    if (this->progress_) this->progress_();
  };
}

template <class ExecSpace>
InputSpec Llama<ExecSpace>::input() const {
  InputSpec s;
  s.tokens = true;
  s.seq_len = 0;  // any: the data file's
  s.vocab = arch_.vocab;
  return s;
}

template <class ExecSpace>
template <class F>
void Llama<ExecSpace>::each_buffer(BlockCache& a, BlockCache& b, F&& f) const {
  const int64_t H = arch_.hidden, Q = arch_.q_features(), KV = arch_.kv_features(),
                I = arch_.intermediate, r = this->cfg_.rank;
  f(a.x, b.x, "x", H), f(a.n1, b.n1, "n1", H), f(a.q, b.q, "q", Q), f(a.k, b.k, "k", KV);
  f(a.v, b.v, "v", KV), f(a.att, b.att, "att", Q), f(a.mid, b.mid, "mid", H);
  f(a.n2, b.n2, "n2", H), f(a.gate, b.gate, "gate", I), f(a.up, b.up, "up", I);
  f(a.act, b.act, "act", I), f(a.inv1, b.inv1, "inv1", 1), f(a.inv2, b.inv2, "inv2", 1);
  f(a.lse, b.lse, "lse", arch_.heads);
  for (int p = 0; p < kLlamaProjections; ++p) {
    if (!targets_[p]) continue;
    f(a.h[p], b.h[p], "h", r);
    if (this->cfg_.dropout > 0) f(a.xd[p], b.xd[p], "xd", projection_shape(arch_, p)[1]);
  }
}

template <class ExecSpace>
template <class F>
void Llama<ExecSpace>::each_buffer(Buffers& a, Buffers& b, F&& f) const {
  const int64_t H = arch_.hidden, Q = arch_.q_features(), KV = arch_.kv_features(),
                I = arch_.intermediate, r = this->cfg_.rank;
  f(a.x_out, b.x_out, "x_out", H), f(a.nf, b.nf, "nf", H), f(a.invf, b.invf, "invf", 1);
  f(a.g, b.g, "g", H), f(a.gtmp, b.gtmp, "gtmp", H), f(a.gn, b.gn, "gn", H);
  f(a.gatt, b.gatt, "gatt", Q), f(a.gq, b.gq, "gq", Q), f(a.gk, b.gk, "gk", KV);
  f(a.gv, b.gv, "gv", KV), f(a.gact, b.gact, "gact", I), f(a.ggate, b.ggate, "ggate", I);
  f(a.gup, b.gup, "gup", I), f(a.proj_out, b.proj_out, "proj_out", H);
  f(a.lora.gh, b.lora.gh, "gh", r), f(a.lora.tmp, b.lora.tmp, "tmp", std::max({H, Q, I}));
}

template <class ExecSpace>
void Llama<ExecSpace>::ensure(int64_t sequences, int64_t S) {
  const int64_t T = sequences * S;
  if (S > rope_.cos.extent_int(0)) {
    KQLORA_INPUT_CHECK(arch_.sliding_window == 0 || S <= arch_.sliding_window,
                       this->cfg_.arch_source
                           << ": sliding_window " << arch_.sliding_window
                           << " is shorter than the data's sequences of " << S
                           << " tokens (sliding-window attention is not supported)");
    rope_ = RopeTable<Mem>(inv_freq_, S, this->cfg_.bf16());  // (positions 0..S-1 of any row)
  }
  if (T == tokens_ && S == seq_len_) return;
  // The buffers grow to the most tokens a batch has had and are never shrunk: a batch
  // uses the first T rows of each (a shorter micro-batch, trimmed or the last of an
  // evaluation, allocates nothing).
  const bool grow = T > capacity_;
  if (grow) {
    capacity_ = T;
    for (auto& c : store_) c = BlockCache();  // (the old buffers go first)
    work_store_ = BlockCache();
    buffers_store_ = Buffers();
  }
  auto rows = [&](auto& store, auto& view, const char* label, int64_t width) {
    using V = std::decay_t<decltype(store)>;
    if constexpr (V::rank == 2) {
      if (grow)
        store = V(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::Llama::") + label),
            capacity_, width);
      view = V(store.data(), T, width);
    } else {
      if (grow)
        store = V(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kqlora::Llama::") + label),
            capacity_ * width);
      view = V(store.data(), T * width);
    }
  };
  if (this->cfg_.activation_checkpointing) {
    // Each block keeps its input; one block's worth of activations serves the forward and
    // each block's recomputation in the backward.
    for (size_t l = 0; l < cache_.size(); ++l) rows(store_[l].x, cache_[l].x, "x", arch_.hidden);
    each_buffer(work_store_, work_, rows);
  } else {
    for (size_t l = 0; l < cache_.size(); ++l) each_buffer(store_[l], cache_[l], rows);
  }
  each_buffer(buffers_store_, buf_, rows);
  tokens_ = T;
  seq_len_ = S;
}

template <class ExecSpace>
double Llama<ExecSpace>::train_flops(int64_t sequences, int64_t positions) const {
  return llama_train_flops(arch_, this->cfg_.rank, targets_, sequences, positions);
}

template <class ExecSpace>
auto Llama<ExecSpace>::adapter(int l, int p) const -> LoraAdapterViews<Mem> {
  const Block& b = blocks_[l];
  LoraAdapterViews<Mem> v;
  v.a = this->matrix(this->compute_, *b.a[p]);
  v.b = this->matrix(this->compute_, *b.b[p]);
  v.ga = this->matrix(this->grads, *b.a[p]);
  v.gb = this->matrix(this->grads, *b.b[p]);
  v.scale = this->cfg_.scale();
  return v;
}

template <class ExecSpace>
DropoutKey Llama<ExecSpace>::dropout_key(int l, int p, int64_t features) const {
  // Keyed by (step, global sequence, position, layer, projection, feature): rows are the
  // tokens of global sequences, so the sample index counts tokens -- of the data file's
  // rows, a trimmed batch's being shorter.
  return {this->cfg_.seed,
          layer_stream(RandomStream::dropout, l * kLlamaProjections + p),
          step_,
          global_bs_ * row_len_,
          first_sample_ * row_len_,
          features,
          static_cast<float>(this->cfg_.dropout)};
}

template <class ExecSpace>
auto Llama<ExecSpace>::dense_vector(const ParamEntry* e) const -> Kokkos::View<const float*, Mem> {
  return this->dense[e->offset];
}

template <class ExecSpace>
auto Llama<ExecSpace>::dense_matrix(const ParamEntry* e) const -> Matrix<Mem> {
  return Matrix<Mem>(this->dense[e->offset].data(), e->shape[0], e->shape[1]);
}

template <class ExecSpace>
void Llama<ExecSpace>::project(int l, int p, BlockCache& c, const Matrix<Mem>& x,
                               const Matrix<Mem>& y) {
  const bool bf16 = this->cfg_.bf16();
  if (!targets_[p]) {
    lora_projection_forward<ExecSpace, Mem>(this->exec_, this->nf4[blocks_[l].w[p]->offset],
                                            nullptr, x, x, bf16, Matrix<Mem>(), buf_.lora, ws_, y);
    return;
  }
  Matrix<Mem> xd = x;
  if (dropout_on_) {
    dropout_apply(this->exec_, dropout_key(l, p, x.extent(1)), bf16, x, c.xd[p], 0.0f);
    xd = c.xd[p];
  }
  const auto lora = adapter(l, p);
  lora_projection_forward(this->exec_, this->nf4[blocks_[l].w[p]->offset], &lora, x, xd, bf16,
                          c.h[p], buf_.lora, ws_, y);
}

template <class ExecSpace>
void Llama<ExecSpace>::project_back(int l, int p, const BlockCache& c, const Matrix<Mem>& gy,
                                    bool accumulate, float gx_beta, const Matrix<Mem>& gx) {
  const bool bf16 = this->cfg_.bf16();
  const auto& W = this->nf4[blocks_[l].w[p]->offset];
  if (!targets_[p]) {
    if (gx.data())
      lora_projection_backward<ExecSpace, Mem>(this->exec_, W, nullptr, gy, Matrix<Mem>(),
                                               Matrix<Mem>(), accumulate, nullptr, bf16, buf_.lora,
                                               ws_, gx_beta, gx);
    return;
  }
  const auto lora = adapter(l, p);
  const DropoutKey key = dropout_key(l, p, projection_shape(arch_, p)[1]);
  // The input this projection read: its dropped-out copy, or the shared input itself.
  Matrix<Mem> x_read;
  if (dropout_on_) {
    x_read = c.xd[p];
  } else {
    x_read = p <= kV ? c.n1 : p == kO ? c.att : p == kDown ? c.act : c.n2;
  }
  lora_projection_backward(this->exec_, W, &lora, gy, x_read, c.h[p], accumulate,
                           dropout_on_ ? &key : nullptr, bf16, buf_.lora, ws_, gx_beta, gx);
}

template <class ExecSpace>
auto Llama<ExecSpace>::block_cache(int l) -> BlockCache& {
  if (!this->cfg_.activation_checkpointing) return cache_[l];
  work_.x = cache_[l].x;  // (the block's own input; the rest is shared)
  return work_;
}

template <class ExecSpace>
void Llama<ExecSpace>::block_forward(int l, BlockCache& c, const Matrix<Mem>& next) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const float eps = static_cast<float>(arch_.rms_norm_eps);
  const int64_t S = seq_len_;
  const AttentionShape shape{tokens_ / S, S, arch_.heads, arch_.kv_heads, arch_.head_dim};
  const Block& B = blocks_[l];
  rms_norm_forward(exec, c.x, dense_vector(B.ln1), eps, bf16, c.n1, c.inv1);
  project(l, kQ, c, c.n1, c.q);
  project(l, kK, c, c.n1, c.k);
  project(l, kV, c, c.n1, c.v);
  rope_apply(exec, rope_, S, arch_.head_dim, false, bf16, c.q);
  rope_apply(exec, rope_, S, arch_.head_dim, false, bf16, c.k);
  causal_attention_forward(exec, shape, c.q, c.k, c.v, bf16, att_ws_, c.att, c.lse);
  project(l, kO, c, c.att, buf_.proj_out);
  Kokkos::deep_copy(exec, c.mid, c.x);
  residual_add(exec, buf_.proj_out, bf16, c.mid);
  rms_norm_forward(exec, c.mid, dense_vector(B.ln2), eps, bf16, c.n2, c.inv2);
  project(l, kGate, c, c.n2, c.gate);
  project(l, kUp, c, c.n2, c.up);
  swiglu_forward(exec, c.gate, c.up, bf16, c.act);
  project(l, kDown, c, c.act, buf_.proj_out);  // (its adapter's h and dropout mask too)
  if (!next.data()) return;  // a recomputation: the backward needs no block output
  Kokkos::deep_copy(exec, next, c.mid);
  residual_add(exec, buf_.proj_out, bf16, next);
}

template <class ExecSpace>
double Llama<ExecSpace>::forward(const Batch<Mem>& b, double normaliser, bool training,
                                 bool with_grads) {
  const ExecSpace& exec = this->exec_;
  const int64_t n = b.tokens.extent(0), S = b.tokens.extent(1);
  ensure(n, S);
  step_ = b.step;
  first_sample_ = b.first_sample;
  global_bs_ = b.global_bs;
  row_len_ = b.row_len > 0 ? b.row_len : S;
  dropout_on_ = training && this->cfg_.dropout > 0;
  const bool bf16 = this->cfg_.bf16();
  const float eps = static_cast<float>(arch_.rms_norm_eps);
  embedding_forward(exec, dense_vector(embed_), b.tokens, cache_[0].x);
  for (int l = 0; l < arch_.layers; ++l) {
    const Matrix<Mem>& next = l + 1 < arch_.layers ? cache_[l + 1].x : buf_.x_out;
    this->acquire(blocks_[l].w[0]->group);
    block_forward(l, block_cache(l), next);
    this->release(blocks_[l].w[0]->group);
  }
  rms_norm_forward(exec, buf_.x_out, dense_vector(norm_), eps, bf16, buf_.nf, buf_.invf);
  return lm_head_cross_entropy(exec, buf_.nf, dense_matrix(head_), b.labels, normaliser, bf16,
                               with_grads ? buf_.gn : Matrix<Mem>(), ce_ws_);
}

template <class ExecSpace>
void Llama<ExecSpace>::backward(bool accumulate) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t n = tokens_ / seq_len_, S = seq_len_;
  const AttentionShape shape{n, S, arch_.heads, arch_.kv_heads, arch_.head_dim};
  rms_norm_backward(exec, buf_.x_out, dense_vector(norm_),
                    Kokkos::View<const float*, Mem>(buf_.invf), buf_.gn, buf_.g);
  if (bf16) round_bf16(exec, buf_.g);
  for (int l = arch_.layers - 1; l >= 0; --l) {
    const Block& B = blocks_[l];
    this->acquire(B.w[0]->group);
    BlockCache& c = block_cache(l);
    if (this->cfg_.activation_checkpointing) block_forward(l, c, Matrix<Mem>());
    // MLP: g is the gradient of the block's output (and of mid, through the residual).
    project_back(l, kDown, c, buf_.g, accumulate, 0.0f, buf_.gact);
    swiglu_backward(exec, c.gate, c.up, buf_.gact, bf16, buf_.ggate, buf_.gup);
    project_back(l, kGate, c, buf_.ggate, accumulate, 0.0f, buf_.gn);
    project_back(l, kUp, c, buf_.gup, accumulate, 1.0f, buf_.gn);
    rms_norm_backward(exec, c.mid, dense_vector(B.ln2), Kokkos::View<const float*, Mem>(c.inv2),
                      buf_.gn, buf_.gtmp);
    residual_add(exec, buf_.gtmp, bf16, buf_.g);
    // Attention: g is now the gradient of mid (and of the block's input).
    project_back(l, kO, c, buf_.g, accumulate, 0.0f, buf_.gatt);
    causal_attention_backward(exec, shape, c.q, c.k, c.v, c.att, c.lse, buf_.gatt, bf16, att_ws_,
                              buf_.gq, buf_.gk, buf_.gv);
    rope_apply(exec, rope_, S, arch_.head_dim, true, bf16, buf_.gq);
    rope_apply(exec, rope_, S, arch_.head_dim, true, bf16, buf_.gk);
    const Matrix<Mem> gx = l > 0 ? buf_.gn : Matrix<Mem>();  // layer 0: no input gradient
    project_back(l, kQ, c, buf_.gq, accumulate, 0.0f, gx);
    project_back(l, kK, c, buf_.gk, accumulate, 1.0f, gx);
    project_back(l, kV, c, buf_.gv, accumulate, 1.0f, gx);
    if (l > 0) {
      rms_norm_backward(exec, c.x, dense_vector(B.ln1), Kokkos::View<const float*, Mem>(c.inv1),
                        buf_.gn, buf_.gtmp);
      residual_add(exec, buf_.gtmp, bf16, buf_.g);
    }
    this->release(B.w[0]->group);
    this->group_done(B.w[0]->group);
  }
}

template <class ExecSpace>
double Llama<ExecSpace>::forward_backward(const Batch<Mem>& b, double normaliser, bool accumulate) {
  const double loss = forward(b, normaliser, true, true);
  backward(accumulate);
  return loss;
}

template <class ExecSpace>
double Llama<ExecSpace>::loss(const Batch<Mem>& b, double normaliser) {
  return forward(b, normaliser, false, false);
}

template <class ExecSpace>
auto Llama<ExecSpace>::logits(const Batch<Mem>& b) -> Matrix<Mem> {
  forward(b, 1.0, false, false);
  Matrix<Mem> out("kqlora::Llama::logits", tokens_, arch_.vocab);
  gemm(this->exec_, "N", "T", 1.0f, buf_.nf, dense_matrix(head_), 0.0f, out);
  if (this->cfg_.bf16()) round_bf16(this->exec_, out);
  return out;
}

template class Llama<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
