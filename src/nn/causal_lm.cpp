#include "kqlora/nn/causal_lm.hpp"

#include <algorithm>
#include <array>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/clip_values.hpp"
#include "kqlora/nn/embedding.hpp"
#include "kqlora/nn/fused_columns.hpp"
#include "kqlora/nn/gated_mlp.hpp"
#include "kqlora/nn/residual.hpp"
#include "kqlora/nn/rms_norm.hpp"
#include "kqlora/nn/sparse_mlp.hpp"

namespace kqlora {

DecoderSpec decoder_spec_of(const ModelConfig& cfg) {
  KQLORA_INPUT_CHECK(
      !cfg.arch_text.empty(),
      "model = " << cfg.kind << " needs hf_model_dir (a directory with config.json)");
  return parse_decoder_config(cfg.arch_text, cfg.arch_source);
}

double decoder_train_flops(const DecoderSpec& s, int64_t rank, const std::vector<bool>& targets,
                           int64_t sequences, int64_t positions) {
  const double T = static_cast<double>(sequences * positions);
  // Forward and input gradient of every projection a layer has (none into layer 0's input)
  // and of the LM head; 6 rank-r products per adapter; a sparse layer's router and its
  // active experts (k of E per token: 3 products each); the attention's computed scores (3
  // forward-and-backward pairs of QK^T and PV sized matmuls over the visible (query, key)
  // pairs). Summed layer by layer: layers may differ.
  double projections = 0, lora = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    double weights = 0, first_inputs = 0, lora_io = 0;
    for (size_t p = 0; p < s.projections.size(); ++p) {
      const ProjectionSpec& proj = s.projections[p];
      if (!s.has_projection(l, proj)) continue;
      const double n = static_cast<double>(s.out_features(proj) * s.in_features(proj));
      weights += n;
      if (proj.input == ProjectionInput::attn_norm) first_inputs += n;
      if (targets[p]) lora_io += static_cast<double>(s.out_features(proj) + s.in_features(proj));
    }
    projections += 2 * T * (2 * weights - (l == 0 ? first_inputs : 0));
    if (s.layer[static_cast<size_t>(l)].sparse) {
      const ExpertsSpec& e = s.experts;
      const double expert = 3.0 * static_cast<double>(e.intermediate * s.hidden);
      projections +=
          2 * 2 * T *
          (static_cast<double>(e.top_k) * expert + static_cast<double>(e.experts * s.hidden));
    }
    lora += 2 * T * static_cast<double>(rank) * 3 * lora_io;
  }
  const double head = 2 * T * 2 * static_cast<double>(s.vocab * s.hidden);
  double attention = 0;
  for (const LayerSpec& l : s.layer) {
    double pairs = 0;  // per sequence: sum over positions of min(p + 1, window)
    for (int64_t p = 0; p < positions; ++p)
      pairs += static_cast<double>(l.window > 0 ? std::min(p + 1, l.window) : p + 1);
    attention += static_cast<double>(sequences) * static_cast<double>(s.heads) * 6 * 2 * pairs *
                 static_cast<double>(s.head_dim);
  }
  return projections + head + attention + lora;
}

namespace {

using B = DecoderBuffers;

std::string layer_prefix(int l) {
  return "model.layers." + std::to_string(l);
}

/// Expert j's weight w (0 gate, 1 up, 2 down) of layer prefix g: the hub's per-expert name.
std::string expert_weight_name(const DecoderSpec& s, const std::string& g, int64_t j, int w) {
  const ExpertsSpec& e = s.experts;
  return g + "." + e.experts_module + "." + std::to_string(j) + "." +
         (w == 0   ? e.gate_name
          : w == 1 ? e.up_name
                   : e.down_name) +
         ".weight";
}

/// The norm's weight name: a layer's module, or the final norm's own path.
std::string norm_name(const NormSpec& n, const std::string& layer) {
  return n.role == NormRole::final ? n.module + ".weight" : layer + "." + n.module + ".weight";
}

/// A [T, width] buffer viewed as [T * width / d, d] rows (per-head norms).
template <class M>
Matrix<M> per_head(const Matrix<M>& m, int64_t d) {
  return Matrix<M>(m.data(), m.extent(0) * m.extent(1) / d, d);
}

template <class M>
Kokkos::View<float*, M> flat(const Matrix<M>& m) {
  return Kokkos::View<float*, M>(m.data(), m.extent(0) * m.extent(1));
}

/// A sparse layer's expert adapters, as PEFT's target_parameters puts them on transformers'
/// fused expert parameters, in an expert-major layout of its own: gate_up's A [E * r,
/// hidden] (PEFT's lora_A: expert e's rows e*r .. e*r+r-1), its B [E * 2I, r] (expert e's
/// gate rows, then its up rows; PEFT's lora_B is [2I, r * E] with expert e in columns
/// k * E + e), and down's A [E * r, I] and B [E * hidden, r] likewise.
void add_expert_adapters(const DecoderSpec& s, const ModelConfig& cfg, std::array<bool, 2> on,
                         int l, ParamTable& t) {
  if (!on[0] && !on[1]) return;
  using Dist = InitRule::Dist;
  const ExpertsSpec& x = s.experts;
  const std::string g = layer_prefix(l), m = g + "." + x.experts_module;
  KQLORA_INPUT_CHECK(cfg.dropout == 0, "lora_dropout " << cfg.dropout
                                                       << " with the experts as LoRA targets: "
                                                          "PEFT refuses it on fused expert "
                                                          "parameters too (set it to 0)");
  KQLORA_INPUT_CHECK(cfg.rank >= 1 && cfg.rank <= std::min(x.intermediate, s.hidden),
                     "lora_rank " << cfg.rank << " must be between 1 and "
                                  << std::min(x.intermediate, s.hidden) << " (the experts' sides)");
  const int64_t E = x.experts, r = cfg.rank;
  for (int w = 0; w < 2; ++w) {
    if (!on[w]) continue;
    const std::string name = m + "." + (w == 0 ? "gate_up_proj" : "down_proj");
    const int64_t in = w == 0 ? s.hidden : x.intermediate,
                  out = w == 0 ? 2 * x.intermediate : s.hidden;
    // (streams apart from the projections' l * P + p)
    const uint64_t stream = (uint64_t(1) << 31) + 2 * static_cast<uint64_t>(l) + w;
    ParamEntry e;
    e.name = name + ".lora_a.weight";
    e.shape = {E * r, in};
    e.init = {Dist::uniform, in, static_cast<uint64_t>(RandomStream::lora_a) + stream};
    t.add(e, g);
    e.name = name + ".lora_b.weight";
    e.shape = {E * out, r};
    e.init = {cfg.lora_b_zeros ? Dist::zeros : Dist::uniform, r,
              static_cast<uint64_t>(RandomStream::lora_b) + stream};
    t.add(e, g);
  }
  t.export_refusal = "adapters on the experts (lora_targets " + cfg.lora_targets +
                     ") are not written by kqlora-export yet (issue 50): export a run without them";
}

}  // namespace

template <class ExecSpace>
ParamTable CausalLm<ExecSpace>::make_table(const ModelConfig& cfg) {
  const DecoderSpec s = decoder_spec_of(cfg);
  const auto targets = parse_lora_targets(cfg.lora_targets, s, "lora_targets");
  const auto expert_targets = expert_lora_targets(cfg.lora_targets, s);
  const uint64_t P = s.projections.size();
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
  add_dense("model.embed_tokens.weight", {s.vocab, s.hidden}, "embed");
  for (int l = 0; l < s.layers; ++l) {
    const std::string g = layer_prefix(l);
    for (uint64_t p = 0; p < P; ++p) {  // the adapters first: contiguous per group
      const ProjectionSpec& proj = s.projections[p];
      if (!targets[p] || !s.has_projection(l, proj)) continue;
      const int64_t out = s.out_features(proj), in = s.in_features(proj);
      const std::string m = g + "." + proj.module;
      KQLORA_INPUT_CHECK(cfg.rank >= 1 && cfg.rank <= std::min(out, in),
                         "lora_rank " << cfg.rank << " must be between 1 and " << std::min(out, in)
                                      << " (the smaller side of " << m << " [" << out << ", " << in
                                      << "])");
      const uint64_t stream = static_cast<uint64_t>(l) * P + p;
      ParamEntry e;
      e.name = m + ".lora_a.weight";
      e.shape = {cfg.rank, in};
      e.init = {Dist::uniform, in, static_cast<uint64_t>(RandomStream::lora_a) + stream};
      t.add(e, g);
      e.name = m + ".lora_b.weight";
      e.shape = {out, cfg.rank};
      e.init = {cfg.lora_b_zeros ? Dist::zeros : Dist::uniform, cfg.rank,
                static_cast<uint64_t>(RandomStream::lora_b) + stream};
      t.add(e, g);
      t.adapters.push_back({m, m + ".weight", m + ".lora_a.weight", m + ".lora_b.weight", cfg.alpha,
                            cfg.rank, cfg.dropout});
    }
    if (s.layer[static_cast<size_t>(l)].sparse) add_expert_adapters(s, cfg, expert_targets, l, t);
    auto add_nf4 = [&](const std::string& name, std::vector<int64_t> shape) {
      ParamEntry e;
      e.name = name;
      e.shape = std::move(shape);
      e.kind = ParamKind::nf4;
      e.dtype = cfg.dtype;
      e.block_size = cfg.block_size;
      e.scaler_block_size = cfg.scaler_block_size;
      e.init.dist = Dist::file;
      t.add(e, g);
    };
    for (const ProjectionSpec& proj : s.projections)
      if (s.has_projection(l, proj))
        add_nf4(g + "." + proj.module + ".weight", {s.out_features(proj), s.in_features(proj)});
    const bool sparse = s.layer[static_cast<size_t>(l)].sparse;
    if (sparse)
      for (const std::string& m : {s.experts.experts_module, s.experts.fused_module})
        if (t.owned_prefixes.empty() || t.owned_prefixes.back() != g + "." + m + ".")
          t.owned_prefixes.push_back(g + "." + m + ".");
    if (sparse) {  // every expert's gate, up and down in NF4, one tensor each
      const int64_t E = s.experts.experts, I = s.experts.intermediate, H = s.hidden;
      const std::string m = g + "." + s.experts.fused_module;
      for (int64_t j = 0; j < E; ++j)
        for (int w = 0; w < 3; ++w) {
          add_nf4(expert_weight_name(s, g, j, w),
                  w < 2 ? std::vector<int64_t>{I, H} : std::vector<int64_t>{H, I});
          // (or its rows of transformers 5's fused parameters: gate then up in gate_up_proj)
          ParamEntry& e = t.entries.back();
          e.alt_tensor = m + (w < 2 ? ".gate_up_proj" : ".down_proj");
          e.alt_shape = w < 2 ? std::vector<int64_t>{E, 2 * I, H} : std::vector<int64_t>{E, H, I};
          e.alt_first = w < 2 ? (j * 2 * I + w * I) * H : j * H * I;
        }
    }
    for (const ProjectionSpec& proj : s.projections)
      if (proj.bias && s.has_projection(l, proj))
        add_dense(g + "." + proj.module + ".bias", {s.out_features(proj)}, g);
    // (the router in the run's dtype, as transformers computes its logits: frozen, and a
    // few E x hidden values whose rounding to NF4 could flip which experts a token gets)
    if (sparse) {
      add_dense(g + "." + s.experts.router_module + ".weight", {s.experts.experts, s.hidden}, g);
      if (s.experts.fused_router != s.experts.router_module) {  // (transformers 5's name)
        ParamEntry& e = t.entries.back();
        e.alt_tensor = g + "." + s.experts.fused_router + ".weight";
        e.alt_shape = e.shape;
      }
    }
    for (const NormSpec& n : s.norms)
      if (n.role != NormRole::final) add_dense(norm_name(n, g), {s.norm_width(n)}, g);
  }
  add_dense(norm_name(*s.norm(NormRole::final), ""), {s.hidden}, "head");
  if (!s.tied) add_dense("lm_head.weight", {s.vocab, s.hidden}, "head");
  return t;
}

template <class ExecSpace>
CausalLm<ExecSpace>::CausalLm(const ExecSpace& exec, const ModelConfig& cfg, bool zeroed)
    : Model<ExecSpace>(exec, cfg, make_table(cfg), zeroed), spec_(decoder_spec_of(cfg)) {
  const ParamTable& t = this->table_;
  targets_ = parse_lora_targets(cfg.lora_targets, spec_, "lora_targets");
  table_of_buffers_ = decoder_buffers(spec_, cfg, targets_);
  for (int l = 0; l < spec_.layers; ++l) {
    const std::string g = layer_prefix(l);
    Block b;
    for (size_t p = 0; p < spec_.projections.size(); ++p) {
      const ProjectionSpec& proj = spec_.projections[p];
      const std::string m = g + "." + proj.module;
      Projection x;
      if (!spec_.has_projection(l, proj)) {  // (a sparse layer's dense MLP: none)
        b.proj.push_back(x);
        continue;
      }
      x.w = &t.at(m + ".weight");
      if (targets_[p]) {
        x.a = &t.at(m + ".lora_a.weight");
        x.b = &t.at(m + ".lora_b.weight");
      }
      if (proj.bias) x.bias = &t.at(m + ".bias");
      b.proj.push_back(x);
    }
    if (spec_.layer[static_cast<size_t>(l)].sparse) {
      const std::string m = g + "." + spec_.experts.experts_module;
      b.gate_up_lora = {t.find(m + ".gate_up_proj.lora_a.weight"),
                        t.find(m + ".gate_up_proj.lora_b.weight")};
      b.down_lora = {t.find(m + ".down_proj.lora_a.weight"),
                     t.find(m + ".down_proj.lora_b.weight")};
      b.router = &t.at(g + "." + spec_.experts.router_module + ".weight");
      for (int64_t j = 0; j < spec_.experts.experts; ++j)
        b.experts.push_back({&t.at(expert_weight_name(spec_, g, j, 0)),
                             &t.at(expert_weight_name(spec_, g, j, 1)),
                             &t.at(expert_weight_name(spec_, g, j, 2))});
    }
    b.norm.assign(kNormRoles, nullptr);
    for (const NormSpec& n : spec_.norms)
      if (n.role != NormRole::final) b.norm[static_cast<int>(n.role)] = &t.at(norm_name(n, g));
    blocks_.push_back(b);
  }
  embed_ = &t.at("model.embed_tokens.weight");
  norm_ = &t.at(norm_name(*spec_.norm(NormRole::final), ""));
  head_ = spec_.tied ? embed_ : &t.at("lm_head.weight");
  cache_.resize(static_cast<size_t>(spec_.layers));
  store_.resize(cache_.size());
  offsets_.resize(cache_.size());
  const std::string& aux = cfg.router_aux_loss;
  KQLORA_INPUT_CHECK(aux != "on" || spec_.any_sparse_mlp(),
                     "router_aux_loss = on: " << cfg.arch_source << " describes no experts");
  aux_on_ = spec_.any_sparse_mlp() && (aux == "on" || (aux == "auto" && spec_.experts.aux_loss));
  if (aux_on_) {
    const int64_t E = spec_.experts.experts;
    aux_.counts = Kokkos::View<double*, Mem>("kqlora::CausalLm::aux_counts", E);
    aux_.probs = Kokkos::View<double*, Mem>("kqlora::CausalLm::aux_probs", E);
    aux_.grad = Kokkos::View<float*, Mem>("kqlora::CausalLm::aux_grad", E);
  }
  bf16_kept_ = keeps_bf16_activations<Mem>(cfg);
  bf16_store_.resize(cache_.size());
  rope_.resize(spec_.ropes.size());
  rope_freqs_.assign(spec_.ropes.size(), nullptr);
  ws_.between_panels = [this] {
    if (this->progress_) this->progress_();
  };
}

template <class ExecSpace>
std::vector<std::string> CausalLm<ExecSpace>::notes() const {
  std::vector<std::string> out;
  for (const auto& n : spec_.notes) out.push_back(this->cfg_.arch_source + ": " + n);
  return out;
}

template <class ExecSpace>
InputSpec CausalLm<ExecSpace>::input() const {
  InputSpec s;
  s.tokens = true;
  s.seq_len = 0;  // any: the data file's
  s.vocab = spec_.vocab;
  return s;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::ensure(int64_t sequences, int64_t S) {
  const int64_t T = sequences * S;
  for (size_t i = 0; i < rope_.size(); ++i) {
    // A table covers positions 0 .. S-1 of any row; longrope's frequencies depend on the
    // rows' length, which transformers takes as the padded batch's: the data file's rows,
    // not a micro-batch trimmed to its longest scored row (packed rows: max(position_ids)
    // + 1, set_documents).
    const RopeSpec& r = spec_.ropes[i];
    const std::vector<float>& freqs = r.for_positions(rope_len_);
    if (S > rope_[i].positions() || rope_freqs_[i] != &freqs) {
      rope_[i] = RopeTable<Mem>(this->exec_, freqs, S, this->cfg_.bf16(), r.attention_factor);
      rope_freqs_[i] = &freqs;
    }
  }
  if (T == tokens_ && S == seq_len_) return;
  // The buffers grow to the most tokens a batch has had and are never shrunk: a batch
  // uses the first T rows of each (a shorter micro-batch, trimmed or the last of an
  // evaluation, allocates nothing).
  const bool grow = T > capacity_;
  if (grow) {
    capacity_ = T;
    for (auto& c : store_) c.clear();  // (the old buffers go first)
    for (auto& k : bf16_store_) k = Bf16Bits<Mem>();
    widened_ = Kokkos::View<float*, Mem>();
    work_store_.clear();
    buf_store_.clear();
  }
  // The buffers i of a list that `has(i)` (float32), as views of their first T rows.
  auto rows = [&](const std::vector<ActivationBuffer>& list, Buffers& store, Buffers& view,
                  auto&& has) {
    if (grow || store.empty()) {
      store.assign(list.size(), Matrix<Mem>());
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].width > 0 && has(i))
          store[i] = Matrix<Mem>(
              Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::CausalLm::" + list[i].name),
              capacity_, list[i].width);
    }
    view.assign(list.size(), Matrix<Mem>());
    for (size_t i = 0; i < list.size(); ++i)
      if (store[i].data()) view[i] = Matrix<Mem>(store[i].data(), T, list[i].width);
  };
  // Each layer keeps every block buffer, or with activation checkpointing its input only
  // (one block's buffers then serve the forward and each block's recomputation). Those kept
  // in 16 bits live in one slab of the one block, [T, width] after [T, width], so that a
  // layer's narrowing and widening are one pass each over its first T x slab_width_.
  const auto& block = table_of_buffers_.block;
  const auto in_16_bits = [&](size_t i) { return bf16_kept_ && block[i].bf16_values; };
  const auto in_slab = [&](size_t i) { return kept_per_layer(i) && in_16_bits(i); };
  for (size_t l = 0; l < cache_.size(); ++l)
    rows(block, store_[l], cache_[l],
         [&](size_t i) { return kept_per_layer(i) && !in_16_bits(i); });
  if (this->cfg_.activation_checkpointing || bf16_kept_)
    rows(block, work_store_, work_, [&](size_t i) { return !kept_per_layer(i); });
  if (bf16_kept_) {
    slab_width_ = 0;
    for (size_t i = 0; i < block.size(); ++i)
      if (in_slab(i)) slab_width_ += block[i].width;
    const int64_t n = capacity_ * slab_width_;
    if (static_cast<int64_t>(widened_.extent(0)) < n) {
      widened_ = Kokkos::View<float*, Mem>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::CausalLm::widened"), n);
      for (auto& k : bf16_store_)
        k = Bf16Bits<Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::CausalLm::bf16"),
                          n);
    }
    int64_t at = 0;
    for (size_t i = 0; i < block.size(); ++i)
      if (in_slab(i)) {
        work_[i] = Matrix<Mem>(widened_.data() + at, T, block[i].width);
        at += T * block[i].width;
      }
  }
  rows(table_of_buffers_.shared, buf_store_, buf_, [](size_t) { return true; });
  lora_.gh = buf_[B::kGH];
  lora_.tmp = buf_[B::kTmp];
  tokens_ = T;
  seq_len_ = S;
}

template <class ExecSpace>
double CausalLm<ExecSpace>::train_flops(int64_t sequences, int64_t positions) const {
  return decoder_train_flops(spec_, this->cfg_.rank, targets_, sequences, positions);
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::adapter(int l, int p) const -> LoraAdapterViews<Mem> {
  const Projection& x = blocks_[l].proj[p];
  LoraAdapterViews<Mem> v;
  v.a = this->matrix(this->compute_, *x.a);
  v.b = this->matrix(this->compute_, *x.b);
  v.ga = this->matrix(this->grads, *x.a);
  v.gb = this->matrix(this->grads, *x.b);
  v.scale = this->cfg_.scale();
  return v;
}

template <class ExecSpace>
DropoutKey CausalLm<ExecSpace>::dropout_key(int l, int p, int64_t features) const {
  // Keyed by (step, global sequence, position, layer, projection, feature): rows are the
  // tokens of global sequences, so the sample index counts tokens -- of the data file's
  // rows, a trimmed batch's being shorter.
  const int P = static_cast<int>(spec_.projections.size());
  return {this->cfg_.seed,
          layer_stream(RandomStream::dropout, l * P + p),
          step_,
          global_bs_ * row_len_,
          first_sample_ * row_len_,
          features,
          static_cast<float>(this->cfg_.dropout)};
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::dense_vector(const ParamEntry* e) const
    -> Kokkos::View<const float*, Mem> {
  return this->dense[e->offset];
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::dense_matrix(const ParamEntry* e) const -> Matrix<Mem> {
  return Matrix<Mem>(this->dense[e->offset].data(), e->shape[0], e->shape[1]);
}

template <class ExecSpace>
GemmInputs CausalLm<ExecSpace>::head_inputs() const {
  // (the final norm rounds its output in a bfloat16 run; the head is rounded where its
  // dtype is bfloat16, train/init.cpp)
  return this->cfg_.bf16() && head_->dtype == DType::bfloat16 ? GemmInputs::bfloat16
                                                              : GemmInputs::float32;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::slot_output(Buffers& c, Slot s) -> Matrix<Mem> {
  const bool qk_norm = spec_.norm(NormRole::q) != nullptr;
  switch (s) {
    case Slot::q:
      return qk_norm ? c[B::kQRaw] : c[B::kQ];
    case Slot::k:
      return qk_norm ? c[B::kKRaw] : c[B::kK];
    case Slot::v:
      return spec_.clip_qkv > 0 ? c[B::kVRaw] : c[B::kV];
    case Slot::o:
      return spec_.norm(NormRole::attn_out) ? c[B::kORaw] : buf_[B::kProjOut];
    case Slot::gate:
      return c[B::kGate];
    case Slot::up:
      return c[B::kUp];
    default:
      return spec_.norm(NormRole::mlp_out) ? c[B::kDRaw] : buf_[B::kProjOut];
  }
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::slot_gradient(Slot s) -> Matrix<Mem> {
  switch (s) {
    case Slot::q:
      return buf_[B::kGQ];
    case Slot::k:
      return buf_[B::kGK];
    case Slot::v:
      return buf_[B::kGV];
    case Slot::gate:
      return buf_[B::kGGate];
    default:
      return buf_[B::kGUp];
  }
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::projection_input(const Buffers& c, int p) const -> Matrix<Mem> {
  switch (spec_.projections[p].input) {
    case ProjectionInput::attn_norm:
      return c[B::kN1];
    case ProjectionInput::attn_out:
      return c[B::kAtt];
    case ProjectionInput::mlp_norm:
      return c[B::kN2];
    default:
      return c[B::kAct];
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project(int l, int p, Buffers& c) {
  const bool bf16 = this->cfg_.bf16();
  const ProjectionSpec& spec = spec_.projections[p];
  const Projection& P = blocks_[l].proj[p];
  const Matrix<Mem> x = projection_input(c, p);
  const bool fused = spec.slots.size() > 1;
  const Matrix<Mem> y = fused
                            ? Matrix<Mem>(buf_[B::kFused].data(), tokens_, spec_.out_features(spec))
                            : slot_output(c, spec.slots[0]);
  const Kokkos::View<const float*, Mem> bias =
      P.bias ? dense_vector(P.bias) : Kokkos::View<const float*, Mem>();
  if (!P.a) {
    lora_projection_forward<ExecSpace, Mem>(this->exec_, this->nf4[P.w->offset], nullptr, x, x,
                                            bf16, Matrix<Mem>(), lora_, ws_, y, bias);
  } else {
    Matrix<Mem> xd = x;
    if (dropout_on_) {
      xd = c[DecoderBuffers::xd(p)];
      dropout_apply(this->exec_, dropout_key(l, p, x.extent(1)), bf16, x, xd, 0.0f);
    }
    const auto lora = adapter(l, p);
    lora_projection_forward(this->exec_, this->nf4[P.w->offset], &lora, x, xd, bf16,
                            c[DecoderBuffers::h(p)], lora_, ws_, y, bias);
  }
  if (!fused) return;
  int64_t col = 0;
  for (Slot s : spec.slots) {
    take_columns(this->exec_, y, col, slot_output(c, s));
    col += spec_.slot_width(s);
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project_back(int l, int p, const Buffers& c, const Matrix<Mem>& gy,
                                       bool accumulate, float gx_beta, const Matrix<Mem>& gx) {
  const bool bf16 = this->cfg_.bf16();
  const Projection& P = blocks_[l].proj[p];
  const auto& W = this->nf4[P.w->offset];
  if (!P.a) {
    if (gx.data())
      lora_projection_backward<ExecSpace, Mem>(this->exec_, W, nullptr, gy, Matrix<Mem>(),
                                               Matrix<Mem>(), accumulate, nullptr, bf16, lora_, ws_,
                                               gx_beta, gx);
    return;
  }
  const auto lora = adapter(l, p);
  const DropoutKey key = dropout_key(l, p, spec_.in_features(spec_.projections[p]));
  // The input this projection read: its dropped-out copy, or the shared input itself.
  const Matrix<Mem> x_read = dropout_on_ ? c[DecoderBuffers::xd(p)] : projection_input(c, p);
  lora_projection_backward(this->exec_, W, &lora, gy, x_read, c[DecoderBuffers::h(p)], accumulate,
                           dropout_on_ ? &key : nullptr, bf16, lora_, ws_, gx_beta, gx);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project_back_all(int l, ProjectionInput in, const Buffers& c,
                                           bool accumulate, const Matrix<Mem>& gx) {
  float beta = 0.0f;
  for (size_t p = 0; p < spec_.projections.size(); ++p) {
    const ProjectionSpec& spec = spec_.projections[p];
    if (spec.input != in) continue;
    Matrix<Mem> gy = slot_gradient(spec.slots[0]);
    if (spec.slots.size() > 1) {  // gather the slots' gradients into the fused one's
      gy = Matrix<Mem>(buf_[B::kGFused].data(), tokens_, spec_.out_features(spec));
      int64_t col = 0;
      for (Slot s : spec.slots) {
        put_columns(this->exec_, slot_gradient(s), col, gy);
        col += spec_.slot_width(s);
      }
    }
    project_back(l, static_cast<int>(p), c, gy, accumulate, beta, gx);
    beta = 1.0f;
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::norm_forward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x,
                                       const Matrix<Mem>& y, const Matrix<Mem>& inv) {
  const NormSpec* n = spec_.norm(role);
  rms_norm_forward(this->exec_, x, dense_vector(w), static_cast<float>(spec_.norm_eps),
                   this->cfg_.bf16(), y, flat(inv), n->kind);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::norm_backward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x,
                                        const Matrix<Mem>& inv, const Matrix<Mem>& gy,
                                        const Matrix<Mem>& gx, NormGradOut out) {
  const NormSpec* n = spec_.norm(role);
  rms_norm_backward(this->exec_, x, dense_vector(w), Kokkos::View<const float*, Mem>(flat(inv)), gy,
                    gx, n->kind, out, this->cfg_.bf16());
}

template <class ExecSpace>
AttentionShape CausalLm<ExecSpace>::attention_shape(int l) const {
  AttentionShape a{tokens_ / seq_len_, seq_len_, spec_.heads, spec_.kv_heads, spec_.head_dim};
  a.attn_scale = spec_.attn_scale;
  a.softcap = spec_.attn_softcap;
  a.window = spec_.layer[l].window;
  if (docs_.data()) a.host_doc_start = host_docs_.data();
  return a;
}

template <class ExecSpace>
bool CausalLm<ExecSpace>::kept_per_layer(size_t i) const {
  return !this->cfg_.activation_checkpointing || i == B::kX;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::block_cache(int l) -> Buffers& {
  if (!this->cfg_.activation_checkpointing && !bf16_kept_) return cache_[l];
  // (the layer's own float32 buffers; the rest, and what is widened from 16 bits, shared)
  for (size_t i = 0; i < work_.size(); ++i)
    if (cache_[l][i].data()) work_[i] = cache_[l][i];
  return work_;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::keep_bf16(int l) {
  narrow_to_bf16(this->exec_, widened_, tokens_ * slab_width_, bf16_store_[l]);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::restore_bf16(int l) {
  widen_from_bf16(this->exec_, bf16_store_[l], tokens_ * slab_width_, widened_);
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::sparse_cache(Buffers& c) const -> SparseMlpCache<Mem> {
  // (the index buffers hold int32 in their floats' place: one 4-byte value each)
  const int64_t T = tokens_, K = spec_.experts.top_k, H = spec_.hidden;
  const int64_t I = spec_.experts.intermediate;
  const auto ints = [&](size_t i, int64_t rows, int64_t cols) {
    return IndexMatrix<Mem>(reinterpret_cast<int32_t*>(c[i].data()), rows, cols);
  };
  SparseMlpCache<Mem> sc;
  sc.logits = c[B::kLogits];
  sc.weight = c[B::kWeight];
  sc.chosen = ints(B::kChosen, T, K);
  sc.where = ints(B::kWhere, T, K);
  sc.order = ints(B::kOrder, T * K, 1);
  sc.xg = Matrix<Mem>(c[B::kXg].data(), T * K, H);
  sc.gate = Matrix<Mem>(c[B::kGateG].data(), T * K, I);
  sc.up = Matrix<Mem>(c[B::kUpG].data(), T * K, I);
  sc.act = Matrix<Mem>(c[B::kActG].data(), T * K, I);
  sc.yg = Matrix<Mem>(c[B::kYg].data(), T * K, H);
  const int64_t r = this->cfg_.rank;
  if (c[B::kHGateUp].data()) sc.h_gate_up = Matrix<Mem>(c[B::kHGateUp].data(), T * K, r);
  if (c[B::kHDown].data()) sc.h_down = Matrix<Mem>(c[B::kHDown].data(), T * K, r);
  return sc;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::sparse_scratch() const -> SparseMlpScratch<Mem> {
  const int64_t T = tokens_, K = spec_.experts.top_k, H = spec_.hidden;
  const int64_t I = spec_.experts.intermediate;
  SparseMlpScratch<Mem> s;
  s.gyg = Matrix<Mem>(buf_[B::kGYg].data(), T * K, H);
  s.gxg = Matrix<Mem>(buf_[B::kGXg].data(), T * K, H);
  s.gact = Matrix<Mem>(buf_[B::kGActG].data(), T * K, I);
  s.ggate = Matrix<Mem>(buf_[B::kGGateG].data(), T * K, I);
  s.gup = Matrix<Mem>(buf_[B::kGUpG].data(), T * K, I);
  s.gw = buf_[B::kGW];
  s.glogits = buf_[B::kGLogits];
  return s;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::expert_weights(int l) const -> std::vector<ExpertWeights<Mem>> {
  const Block& B = blocks_[l];
  const int64_t r = this->cfg_.rank, H = spec_.hidden, I = spec_.experts.intermediate;
  // Expert j's rows of an expert-major [E * rows, cols] entry of a flat buffer.
  const auto rows_of = [&](const Vec& v, const ParamEntry* e, int64_t j, int64_t first,
                           int64_t rows) {
    const int64_t cols = e->shape[1];
    return Matrix<Mem>(
        v.data() + e->offset + (j * (e->shape[0] / spec_.experts.experts) + first) * cols, rows,
        cols);
  };
  const auto adapter = [&](const std::pair<const ParamEntry*, const ParamEntry*>& ab, int64_t j,
                           int64_t first, int64_t rows) {
    LoraAdapterViews<Mem> v;
    v.a = rows_of(this->compute_, ab.first, j, 0, r);
    v.ga = rows_of(this->grads, ab.first, j, 0, r);
    v.b = rows_of(this->compute_, ab.second, j, first, rows);
    v.gb = rows_of(this->grads, ab.second, j, first, rows);
    v.scale = this->cfg_.scale();
    return v;
  };
  std::vector<ExpertWeights<Mem>> w;
  for (size_t j = 0; j < B.experts.size(); ++j) {
    const Expert& e = B.experts[j];
    ExpertWeights<Mem> x;
    x.gate = &this->nf4[e.gate->offset];
    x.up = &this->nf4[e.up->offset];
    x.down = &this->nf4[e.down->offset];
    x.gate_up_lora = B.gate_up_lora.first != nullptr;
    x.down_lora = B.down_lora.first != nullptr;
    if (x.gate_up_lora) {
      x.gate_ad = adapter(B.gate_up_lora, static_cast<int64_t>(j), 0, I);
      x.up_ad = adapter(B.gate_up_lora, static_cast<int64_t>(j), I, I);
    }
    if (x.down_lora) x.down_ad = adapter(B.down_lora, static_cast<int64_t>(j), 0, H);
    w.push_back(x);
  }
  return w;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::block_forward(int l, Buffers& c, const Matrix<Mem>& next) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t S = seq_len_, D = spec_.head_dim;
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  const int P = static_cast<int>(spec_.projections.size());
  auto project_all = [&](ProjectionInput in) {
    for (int p = 0; p < P; ++p)
      if (spec_.projections[p].input == in) project(l, p, c);
  };
  norm_forward(norm_of(NormRole::attn_in), NormRole::attn_in, c[B::kX], c[B::kN1], c[B::kInv1]);
  project_all(ProjectionInput::attn_norm);
  if (norm_of(NormRole::q)) {  // q and k norms (per head or whole), before the rotary
    const int64_t wq = spec_.norm_width(*spec_.norm(NormRole::q)),
                  wk = spec_.norm_width(*spec_.norm(NormRole::k));
    norm_forward(norm_of(NormRole::q), NormRole::q, per_head(c[B::kQRaw], wq),
                 per_head(c[B::kQ], wq), c[B::kInvQ]);
    norm_forward(norm_of(NormRole::k), NormRole::k, per_head(c[B::kKRaw], wk),
                 per_head(c[B::kK], wk), c[B::kInvK]);
  }
  if (spec_.clip_qkv > 0) {  // (v from its raw copy: the backward reads the clamp's input)
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kQ], c[B::kQ]);
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kK], c[B::kK]);
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kVRaw], c[B::kV]);
  }
  const RopeTable<Mem>& rope = rope_[spec_.layer[l].rope];
  rope_apply(exec, rope, S, D, false, bf16, c[B::kQ], positions_);
  rope_apply(exec, rope, S, D, false, bf16, c[B::kK], positions_);
  causal_attention_forward(exec, attention_shape(l), c[B::kQ], c[B::kK], c[B::kV], bf16, att_ws_,
                           c[B::kAtt], flat(c[B::kLse]), docs_);
  project_all(ProjectionInput::attn_out);
  if (norm_of(NormRole::attn_out))
    norm_forward(norm_of(NormRole::attn_out), NormRole::attn_out, c[B::kORaw], buf_[B::kProjOut],
                 c[B::kInvO]);
  residual_sum(exec, c[B::kX], buf_[B::kProjOut], bf16, c[B::kMid]);
  norm_forward(norm_of(NormRole::mlp_in), NormRole::mlp_in, c[B::kMid], c[B::kN2], c[B::kInv2]);
  if (spec_.layer[l].sparse) {
    SparseMlpCache<Mem> sc = sparse_cache(c);
    // (the aux loss's sums once per forward: a recomputation adds nothing)
    const bool sum_aux = aux_on_ && next.data();
    sparse_mlp_forward(exec, spec_.experts, spec_.mlp_activation, dense_matrix(B.router),
                       expert_weights(l), c[B::kN2], bf16, sc, lora_, ws_,
                       spec_.norm(NormRole::mlp_out) ? c[B::kDRaw] : buf_[B::kProjOut],
                       sum_aux ? &aux_ : nullptr, buf_[B::kGLogits]);
    offsets_[l] = std::move(sc.offsets);
  } else {
    project_all(ProjectionInput::mlp_norm);
    gated_mlp_forward(exec, spec_.mlp_activation, c[B::kGate], c[B::kUp], bf16, c[B::kAct]);
    project_all(ProjectionInput::mlp_act);  // (its adapter's h and dropout mask too)
  }
  if (norm_of(NormRole::mlp_out))
    norm_forward(norm_of(NormRole::mlp_out), NormRole::mlp_out, c[B::kDRaw], buf_[B::kProjOut],
                 c[B::kInvD]);
  if (!next.data()) return;  // a recomputation: the backward needs no block output
  residual_sum(exec, c[B::kMid], buf_[B::kProjOut], bf16, next);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::set_documents(const TokenMatrix<Mem>& positions) {
  positions_ = positions;
  docs_ = DocStarts<Mem>();
  rope_len_ = row_len_;
  if (!positions.data()) return;
  const int64_t n = positions.extent(0), S = positions.extent(1);
  if (static_cast<int64_t>(doc_store_.extent(0)) < n * S) {
    doc_store_ = Kokkos::View<int32_t*, Mem>();
    doc_store_ = Kokkos::View<int32_t*, Mem>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::CausalLm::doc_start"), n * S);
  }
  // On the host (the attention plans its blocks there), then on the device. (Copied on the
  // model's instance and fenced there: no device-wide sync, docs/GPU.md.)
  const auto hp = Kokkos::create_mirror_view(Kokkos::HostSpace(), positions);  // (or itself)
  Kokkos::deep_copy(this->exec_, hp, positions);
  fence(this->exec_, "kqlora::CausalLm::positions");  // (the host reads them below)
  host_docs_.resize(static_cast<size_t>(n * S));
  int32_t most = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = 0; t < S; ++t) {
      host_docs_[i * S + t] = static_cast<int32_t>(t) - hp(i, t);
      most = std::max(most, hp(i, t));
    }
  const TokenMatrix<Mem> docs(doc_store_.data(), n, S);
  Kokkos::deep_copy(this->exec_, docs,
                    Kokkos::View<const int32_t**, Kokkos::LayoutRight, Kokkos::HostSpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host_docs_.data(), n, S));
  fence(this->exec_, "kqlora::CausalLm::docs");  // (host_docs_ is rewritten by the next batch)
  docs_ = docs;
  rope_len_ = most + 1;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::mark_real_tokens(const TokenMatrix<Mem>& labels) {
  const int64_t n = labels.extent(0), S = labels.extent(1);
  if (static_cast<int64_t>(aux_.real.extent(0)) < n * S)
    aux_.real = Kokkos::View<float*, Mem>("kqlora::CausalLm::aux_real", n * S);
  const double tokens = kqlora::mark_real_tokens(this->exec_, labels, aux_.real);
  Kokkos::deep_copy(this->exec_, aux_.counts, 0.0);
  Kokkos::deep_copy(this->exec_, aux_.probs, 0.0);
  int64_t sparse = 0;
  for (const LayerSpec& l : spec_.layer) sparse += l.sparse;
  aux_.rows = tokens * static_cast<double>(sparse);
}

template <class ExecSpace>
double CausalLm<ExecSpace>::finish_aux_loss(int64_t rows, int64_t global_bs) {
  // One micro-batch's loss, weighted by its share of the global batch's rows: a mean over
  // the micro-batches and ranks, each computed as transformers computes one forward's.
  const int64_t E = spec_.experts.experts;
  auto counts = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.counts);
  auto probs = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.probs);
  Kokkos::deep_copy(this->exec_, counts, aux_.counts);
  Kokkos::deep_copy(this->exec_, probs, aux_.probs);
  fence(this->exec_, "kqlora::CausalLm::aux_sums");  // (read on the host below)
  const double R = aux_.rows, scale = spec_.experts.aux_loss_coef * static_cast<double>(rows) /
                                      static_cast<double>(global_bs);
  auto grad = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.grad);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    aux += R > 0 ? counts(e) / R * probs(e) / R : 0;
    grad(e) = R > 0 ? static_cast<float>(scale * static_cast<double>(E) * counts(e) / (R * R)) : 0;
  }
  Kokkos::deep_copy(this->exec_, aux_.grad, grad);
  fence(this->exec_, "kqlora::CausalLm::aux_grad");  // (grad is freed on return)
  return scale * static_cast<double>(E) * aux;
}

template <class ExecSpace>
double CausalLm<ExecSpace>::forward(const Batch<Mem>& b, double normaliser, bool training,
                                    bool with_grads) {
  const ExecSpace& exec = this->exec_;
  const int64_t n = b.tokens.extent(0), S = b.tokens.extent(1);
  step_ = b.step;
  first_sample_ = b.first_sample;
  global_bs_ = b.global_bs;
  row_len_ = b.row_len > 0 ? b.row_len : S;
  set_documents(b.positions);
  ensure(n, S);
  dropout_on_ = training && this->cfg_.dropout > 0;
  const bool bf16 = this->cfg_.bf16();
  aux_value_ = 0;
  if (aux_on_) mark_real_tokens(b.labels);
  const Matrix<Mem> x0 = block_cache(0)[B::kX];
  embedding_forward(exec, dense_vector(embed_), b.tokens, x0);
  if (spec_.embed_scale > 0) embedding_scale(exec, spec_.embed_scale, bf16, x0);
  for (int l = 0; l < spec_.layers; ++l) {
    // (kept in bfloat16: each block's input is the one block's, its output goes through x_out)
    const bool last = l + 1 == spec_.layers;
    const Matrix<Mem> next = last || bf16_kept_ ? buf_[B::kXOut] : cache_[l + 1][B::kX];
    const int group = blocks_[l].proj[0].w->group;
    this->acquire(group);
    Buffers& c = block_cache(l);
    block_forward(l, c, next);
    if (bf16_kept_) {
      if (with_grads) keep_bf16(l);
      if (!last) Kokkos::deep_copy(exec, c[B::kX], next);
    }
    this->release(group);
  }
  norm_forward(norm_, NormRole::final, buf_[B::kXOut], buf_[B::kNf], buf_[B::kInvF]);
  if (aux_on_) aux_value_ = finish_aux_loss(n, b.global_bs);
  // (kNf, the final norm's output, is read by the head alone: its rows are scratch there)
  return aux_value_ +
         lm_head_cross_entropy(exec, buf_[B::kNf], dense_matrix(head_), b.labels, normaliser, bf16,
                               with_grads ? buf_[B::kGN] : Matrix<Mem>(), ce_ws_,
                               spec_.final_softcap, head_inputs(), HiddenAfter::scratch);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::backward(bool accumulate) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t S = seq_len_, D = spec_.head_dim;
  Buffers& s = buf_;
  norm_backward(norm_, NormRole::final, s[B::kXOut], s[B::kInvF], s[B::kGN], s[B::kG]);
  if (bf16) round_bf16(exec, s[B::kG]);
  const int o_proj = spec_.writer(Slot::o), down_proj = spec_.writer(Slot::down);
  for (int l = spec_.layers - 1; l >= 0; --l) {
    const Block& B = blocks_[l];
    const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
    const int group = B.proj[0].w->group;
    this->acquire(group);
    Buffers& c = block_cache(l);
    if (bf16_kept_) restore_bf16(l);  // (before anything reads c)
    if (this->cfg_.activation_checkpointing) block_forward(l, c, Matrix<Mem>());
    // MLP: g is the gradient of the block's output (and of mid, through the residual).
    Matrix<Mem> g_down = s[B::kG];
    if (norm_of(NormRole::mlp_out)) {
      norm_backward(norm_of(NormRole::mlp_out), NormRole::mlp_out, c[B::kDRaw], c[B::kInvD],
                    s[B::kG], s[B::kGTmp]);
      if (bf16) round_bf16(exec, s[B::kGTmp]);
      g_down = s[B::kGTmp];
    }
    if (spec_.layer[l].sparse) {
      // (the experts' adapters add up their gradients: each expert's A from gate and up, and
      // an expert no token chose keeps a zero gradient)
      const ParamEntry* expert_adapters[] = {B.gate_up_lora.first, B.gate_up_lora.second,
                                             B.down_lora.first, B.down_lora.second};
      if (!accumulate)
        for (const ParamEntry* e : expert_adapters)
          if (e)
            Kokkos::deep_copy(
                exec,
                Kokkos::subview(this->grads, std::make_pair(e->offset, e->offset + e->numel())),
                0.0f);
      SparseMlpCache<Mem> sc = sparse_cache(c);
      sc.offsets = offsets_[l];
      sparse_mlp_backward(exec, spec_.experts, spec_.mlp_activation, dense_matrix(B.router),
                          expert_weights(l), sc, g_down, bf16, sparse_scratch(), lora_, ws_,
                          s[B::kGN], aux_on_ ? &aux_ : nullptr);
    } else {
      project_back(l, down_proj, c, g_down, accumulate, 0.0f, s[B::kGAct]);
      gated_mlp_backward(exec, spec_.mlp_activation, c[B::kGate], c[B::kUp], s[B::kGAct], bf16,
                         s[B::kGGate], s[B::kGUp]);
      project_back_all(l, ProjectionInput::mlp_norm, c, accumulate, s[B::kGN]);
    }
    norm_backward(norm_of(NormRole::mlp_in), NormRole::mlp_in, c[B::kMid], c[B::kInv2], s[B::kGN],
                  s[B::kG], NormGradOut::add);
    // Attention: g is now the gradient of mid (and of the block's input).
    Matrix<Mem> g_o = s[B::kG];
    if (norm_of(NormRole::attn_out)) {
      norm_backward(norm_of(NormRole::attn_out), NormRole::attn_out, c[B::kORaw], c[B::kInvO],
                    s[B::kG], s[B::kGTmp]);
      if (bf16) round_bf16(exec, s[B::kGTmp]);
      g_o = s[B::kGTmp];
    }
    project_back(l, o_proj, c, g_o, accumulate, 0.0f, s[B::kGAtt]);
    causal_attention_backward(exec, attention_shape(l), c[B::kQ], c[B::kK], c[B::kV], c[B::kAtt],
                              flat(c[B::kLse]), s[B::kGAtt], bf16, att_ws_, s[B::kGQ], s[B::kGK],
                              s[B::kGV], docs_);
    const RopeTable<Mem>& rope = rope_[spec_.layer[l].rope];
    rope_apply(exec, rope, S, D, true, bf16, s[B::kGQ], positions_);
    rope_apply(exec, rope, S, D, true, bf16, s[B::kGK], positions_);
    if (spec_.clip_qkv > 0) clip_qkv_backward(l, c);
    if (norm_of(NormRole::q)) {  // (in place: the norm's backward reads a row, then writes it)
      const int64_t wq = spec_.norm_width(*spec_.norm(NormRole::q)),
                    wk = spec_.norm_width(*spec_.norm(NormRole::k));
      norm_backward(norm_of(NormRole::q), NormRole::q, per_head(c[B::kQRaw], wq), c[B::kInvQ],
                    per_head(s[B::kGQ], wq), per_head(s[B::kGQ], wq));
      norm_backward(norm_of(NormRole::k), NormRole::k, per_head(c[B::kKRaw], wk), c[B::kInvK],
                    per_head(s[B::kGK], wk), per_head(s[B::kGK], wk));
      if (bf16) {
        round_bf16(exec, s[B::kGQ]);
        round_bf16(exec, s[B::kGK]);
      }
    }
    const Matrix<Mem> gx = l > 0 ? s[B::kGN] : Matrix<Mem>();  // layer 0: no input gradient
    project_back_all(l, ProjectionInput::attn_norm, c, accumulate, gx);
    if (l > 0) {
      norm_backward(norm_of(NormRole::attn_in), NormRole::attn_in, c[B::kX], c[B::kInv1], s[B::kGN],
                    s[B::kG], NormGradOut::add);
    }
    this->release(group);
    this->group_done(group);
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::clip_qkv_backward(int l, Buffers& c) {
  // The clamp passes the gradient where its input was within [-c, c]: v's input is kept,
  // q's and k's (their norms' outputs, rotated since) are computed again into the then
  // free gradient of the attention output.
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const float clip = spec_.clip_qkv;
  Buffers& s = buf_;
  clip_backward(exec, clip, bf16, c[B::kVRaw], s[B::kGV]);
  for (NormRole role : {NormRole::q, NormRole::k}) {
    const bool q = role == NormRole::q;
    const int64_t w = spec_.norm_width(*spec_.norm(role));
    const Matrix<Mem> raw = c[q ? B::kQRaw : B::kKRaw];
    const Matrix<Mem> normed(s[B::kGAtt].data(), tokens_, raw.extent(1));
    norm_forward(blocks_[l].norm[static_cast<int>(role)], role, per_head(raw, w),
                 per_head(normed, w), c[q ? B::kInvQ : B::kInvK]);
    clip_backward(exec, clip, bf16, normed, s[q ? B::kGQ : B::kGK]);
  }
}

template <class ExecSpace>
double CausalLm<ExecSpace>::forward_backward(const Batch<Mem>& b, double normaliser,
                                             bool accumulate) {
  const double loss = forward(b, normaliser, true, true);
  backward(accumulate);
  return loss;
}

template <class ExecSpace>
double CausalLm<ExecSpace>::loss(const Batch<Mem>& b, double normaliser) {
  return forward(b, normaliser, false, false);
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::logits(const Batch<Mem>& b) -> Matrix<Mem> {
  forward(b, 1.0, false, false);
  Matrix<Mem> out("kqlora::CausalLm::logits", tokens_, spec_.vocab);
  // (the loss's products: over the head's 16-bit copy on bfloat16 hardware, the same sums)
  const Matrix<Mem> W = dense_matrix(head_);
  const bool bf16_unit = impl::head_on_bf16_unit(this->exec_, W, head_inputs(), ce_ws_);
  impl::head_logits(this->exec_, buf_[B::kNf], W, bf16_unit, ce_ws_, head_inputs(), out);
  const bool bf16 = this->cfg_.bf16();
  if (bf16) round_bf16(this->exec_, out);
  const float cap = spec_.final_softcap;
  if (cap > 0)
    Kokkos::parallel_for(
        "kqlora::CausalLm::soft_cap", over(this->exec_, out.extent(0), out.extent(1)),
        KOKKOS_LAMBDA(int64_t t, int64_t v) { out(t, v) = soft_cap(out(t, v), cap, bf16); });
  return out;
}

template class CausalLm<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
