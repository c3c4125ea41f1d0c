#include "kqlora/nn/causal_lm.hpp"

#include <algorithm>
#include <cmath>

#include "decoder_names.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/nn/embedding.hpp"
#include "kqlora/nn/per_layer_input.hpp"
#include "kqlora/nn/residual.hpp"
#include "kqlora/nn/rms_norm.hpp"

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
  // pairs), or a Gated DeltaNet layer's delta rule. Summed layer by layer: layers may
  // differ.
  double projections = 0, lora = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    double weights = 0, first_inputs = 0, lora_io = 0;
    for (size_t p = 0; p < s.projections.size(); ++p) {
      const ProjectionSpec& proj = s.projections[p];
      if (!s.has_projection(l, proj)) continue;
      const int64_t out = s.out_features(proj, l), in = s.in_features(proj, l);
      const double n = static_cast<double>(out * in);
      weights += n;
      if (proj.input == ProjectionInput::attn_norm) first_inputs += n;
      if (targets[p]) lora_io += static_cast<double>(out + in);
    }
    projections += 2 * T * (2 * weights - (l == 0 ? first_inputs : 0));
    if (s.layer[static_cast<size_t>(l)].sparse) {
      const ExpertsSpec& e = s.experts;
      const double expert = 3.0 * static_cast<double>(e.intermediate * s.hidden);
      // (the router's logits, and a shared expert's gate)
      const int64_t routers = e.experts + (s.shared_expert(l) ? 1 : 0);
      projections +=
          2 * 2 * T *
          (static_cast<double>(e.top_k) * expert + static_cast<double>(routers * s.hidden));
    }
    lora += 2 * T * static_cast<double>(rank) * 3 * lora_io;
  }
  const double head = 2 * T * 2 * static_cast<double>(s.vocab * s.hidden);
  double attention = 0;
  for (int64_t at = 0; at < s.layers; ++at) {
    const LayerSpec& l = s.layer[static_cast<size_t>(at)];
    if (l.mixer == Mixer::linear) {
      // The delta rule per token and value head, in chunks of 64: about 2 (64 (2 dk + dv)
      // + 3 dk dv) forward, and the backward's recomputation and gradients three times
      // that (the conv and the norms are a few passes over the projections' outputs).
      const LinearAttentionSpec& L = s.linear;
      const double dk = static_cast<double>(L.key_dim), dv = static_cast<double>(L.value_dim);
      attention +=
          4 * T * static_cast<double>(L.value_heads) * 2 * (64 * (2 * dk + dv) + 3 * dk * dv);
      continue;
    }
    double pairs = 0;  // per sequence: sum over positions of min(p + 1, window)
    for (int64_t p = 0; p < positions; ++p)
      pairs += static_cast<double>(l.window > 0 ? std::min(p + 1, l.window) : p + 1);
    attention += static_cast<double>(sequences) * static_cast<double>(s.heads) * 6 * 2 * pairs *
                 static_cast<double>(s.head_dim_of(at));
  }
  return projections + head + attention + lora;
}

namespace {

using B = DecoderBuffers;
using decoder::expert_weight_name;
using decoder::flat;
using decoder::layer_prefix;
using decoder::norm_name;

}  // namespace

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
      const std::string m = g + "." + spec_.module_of(l, proj);
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
      if (spec_.experts.router_bias)
        b.router_bias = &t.at(g + "." + spec_.experts.router_module + ".bias");
      if (spec_.experts.expert_bias) {
        const std::string f = g + "." + spec_.experts.fused_module;
        b.gate_bias = &t.at(f + ".gate_proj_bias");
        b.up_bias = &t.at(f + ".up_proj_bias");
        b.down_bias = &t.at(f + ".down_proj_bias");
      }
      if (spec_.shared_expert(l))
        b.shared_gate = &t.at(g + "." + spec_.experts.shared_gate_module + ".weight");
      if (!spec_.experts.router_scale.empty()) {  // (Gemma 4)
        b.router_scale = &t.at(g + "." + spec_.experts.router_scale);
        b.per_expert_scale = &t.at(g + "." + spec_.experts.per_expert_scale);
      }
      for (int64_t j = 0; j < spec_.experts.experts; ++j)
        b.experts.push_back({&t.at(expert_weight_name(spec_, g, j, 0)),
                             &t.at(expert_weight_name(spec_, g, j, 1)),
                             &t.at(expert_weight_name(spec_, g, j, 2))});
    }
    const bool linear = spec_.layer[static_cast<size_t>(l)].mixer == Mixer::linear;
    if (spec_.sinks && !linear) b.sinks = &t.at(g + ".self_attn.sinks");
    if (linear) {
      const std::string m = g + "." + spec_.linear.module;
      b.lin_conv = &t.at(m + ".conv1d.weight");
      b.lin_dt_bias = &t.at(m + ".dt_bias");
      b.lin_a_log = &t.at(m + ".A_log");
      b.lin_norm = &t.at(m + ".norm.weight");
    }
    for (const Projection& x : b.proj)
      if (x.w) {
        b.group = x.w->group;
        break;
      }
    b.norm.assign(kNormRoles, nullptr);
    for (const NormSpec& n : spec_.norms)  // (a unit norm has no weight: spec_.norm says it is)
      if (n.role != NormRole::final && n.role != NormRole::ple_proj && n.kind != NormKind::unit &&
          decoder::layer_has_norm(spec_, l, n))
        b.norm[static_cast<int>(n.role)] = &t.at(norm_name(n, g));
    if (spec_.layer_scalar) b.layer_scalar = &t.at(g + ".layer_scalar");
    blocks_.push_back(b);
  }
  embed_ = &t.at("model.embed_tokens.weight");
  if (spec_.ple_width > 0) {
    ple_embed_ = &t.at("model.embed_tokens_per_layer.weight");
    ple_proj_ = &t.at("model.per_layer_model_projection.weight");
    ple_norm_ = &t.at("model.per_layer_projection_norm.weight");
  }
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
void CausalLm<ExecSpace>::norm_forward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x,
                                       const Matrix<Mem>& y, const Matrix<Mem>& inv) {
  const NormSpec* n = spec_.norm(role);  // (w null: a unit norm's, no weight)
  rms_norm_forward(this->exec_, x, w ? dense_vector(w) : Kokkos::View<const float*, Mem>(),
                   static_cast<float>(spec_.norm_eps), this->cfg_.bf16(), y, flat(inv), n->kind);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::norm_backward(const ParamEntry* w, NormRole role, const Matrix<Mem>& x,
                                        const Matrix<Mem>& inv, const Matrix<Mem>& gy,
                                        const Matrix<Mem>& gx, NormGradOut out) {
  const NormSpec* n = spec_.norm(role);
  rms_norm_backward(this->exec_, x, w ? dense_vector(w) : Kokkos::View<const float*, Mem>(),
                    Kokkos::View<const float*, Mem>(flat(inv)), gy, gx, n->kind, out,
                    this->cfg_.bf16());
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
void CausalLm<ExecSpace>::block_forward(int l, Buffers& c, const Matrix<Mem>& next) {
  // The block's order, norms and residuals; its sublayers in files of their own (the
  // attention, decoder_attention.cpp; the dense MLP, decoder_dense_mlp.cpp; the experts,
  // decoder_sparse_mlp.cpp).
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  // (a block without an input norm reads the stream itself: OLMo 2's post-norms,
  // sublayer_input)
  const float rm = spec_.residual_multiplier;
  if (norm_of(NormRole::attn_in))
    norm_forward(norm_of(NormRole::attn_in), NormRole::attn_in, c[B::kX], c[B::kN1], c[B::kInv1]);
  if (spec_.layer[l].mixer == Mixer::linear)
    linear_attention_forward(l, c);
  else
    attention_forward(l, c);
  if (norm_of(NormRole::attn_out))
    norm_forward(norm_of(NormRole::attn_out), NormRole::attn_out, c[B::kORaw], buf_[B::kProjOut],
                 c[B::kInvO]);
  if (rm != 0) scale_values(exec, rm, bf16, buf_[B::kProjOut]);
  residual_sum(exec, c[B::kX], buf_[B::kProjOut], bf16, c[B::kMid]);
  if (norm_of(NormRole::mlp_in))
    norm_forward(norm_of(NormRole::mlp_in), NormRole::mlp_in, c[B::kMid], c[B::kN2], c[B::kInv2]);
  if (spec_.layer[l].sparse) {  // (the aux loss's sums once per forward, not in a recomputation)
    if (spec_.dense_beside_experts(l)) dense_mlp_forward(l, c);
    experts_forward(l, c, aux_on_ && next.data());
  } else {
    dense_mlp_forward(l, c);
  }
  if (norm_of(NormRole::mlp_out))
    norm_forward(norm_of(NormRole::mlp_out), NormRole::mlp_out, c[B::kDRaw], buf_[B::kProjOut],
                 c[B::kInvD]);
  // (a recomputation: the backward needs no block output, but Gemma 4's per-layer input's
  // values after it)
  const bool ple = spec_.ple_width > 0;
  if (!next.data() && !ple) return;
  if (rm != 0) scale_values(exec, rm, bf16, buf_[B::kProjOut]);
  const Matrix<Mem> h = ple ? c[B::kPleIn] : next;
  residual_sum(exec, c[B::kMid], buf_[B::kProjOut], bf16, h);
  if (ple) {  // h' = h + norm(per_layer_projection(act(per_layer_input_gate(h)) * ple_l))
    project(l, spec_.writer(Slot::ple_gate), c);
    ple_gate_forward(exec, spec_.mlp_activation, bf16, c[B::kPleGate], buf_[B::kPle],
                     l * spec_.ple_width, c[B::kPleAct]);
    project(l, spec_.writer(Slot::ple_out), c);
    norm_forward(norm_of(NormRole::ple_out), NormRole::ple_out, c[B::kPleRaw], buf_[B::kProjOut],
                 c[B::kInvPle]);
    if (!next.data()) return;
    residual_sum(exec, h, buf_[B::kProjOut], bf16, next);
  }
  if (B.layer_scalar) scale_by_scalar(exec, dense_vector(B.layer_scalar), bf16, next);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::per_layer_inputs(const TokenMatrix<Mem>& tokens, const Matrix<Mem>& x0) {
  // ple = (norm(x0 W^T * hidden^-1/2) + E_ple[ids] * sqrt(P)) * 2^-1/2, as transformers'
  // Gemma4TextModel (nn/per_layer_input.hpp); frozen inputs, no gradient
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t P = spec_.ple_width;
  Buffers& s = buf_;
  if (ple_embed_->compact)  // (held in bfloat16)
    embedding_forward(exec,
                      Kokkos::View<const bfloat16*, Mem>(this->dense_bf16[ple_embed_->offset]),
                      tokens, s[B::kPle]);
  else
    embedding_forward(exec, dense_vector(ple_embed_), tokens, s[B::kPle]);
  embedding_scale(exec, static_cast<float>(std::sqrt(static_cast<double>(P))), bf16, s[B::kPle]);
  this->acquire(ple_proj_->group);  // (FSDP: its group's NF4, gathered)
  lora_projection_forward<ExecSpace, Mem>(exec, this->nf4[ple_proj_->offset], nullptr, x0, x0, bf16,
                                          Matrix<Mem>(), lora_, ws_, s[B::kPleProj],
                                          Kokkos::View<const float*, Mem>());
  this->release(ple_proj_->group);
  scale_values(exec, static_cast<float>(std::pow(static_cast<double>(spec_.hidden), -0.5)), bf16,
               s[B::kPleProj]);
  // (in place: each row read whole before it is written)
  norm_forward(ple_norm_, NormRole::ple_proj, decoder::per_head(s[B::kPleProj], P),
               decoder::per_head(s[B::kPleProj], P), s[B::kInvPleProj]);
  ple_combine(exec, bf16, s[B::kPleProj], s[B::kPle]);
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
double CausalLm<ExecSpace>::forward(const Batch<Mem>& b, double normaliser, bool training,
                                    bool with_grads) {
  const ExecSpace& exec = this->exec_;
  const int64_t n = b.tokens.extent(0), S = b.tokens.extent(1);
  weighted_ready_ = false;
  step_ = b.step;
  first_sample_ = b.first_sample;
  global_bs_ = b.global_bs;
  row_len_ = b.row_len > 0 ? b.row_len : S;
  set_documents(b.positions);
  ensure(n, S);
  // The Gated DeltaNet layers' documents and chunks (unpacked rows: kept while the batch's
  // shape is the same)
  if (spec_.any_mixer(Mixer::linear) &&
      (docs_.data() || lin_docs_packed_ || lin_docs_rows_ != n || lin_docs_len_ != S)) {
    lin_docs_ = delta_rule_documents(exec, n, S, docs_.data() ? host_docs_.data() : nullptr);
    lin_docs_rows_ = n;
    lin_docs_len_ = S;
    lin_docs_packed_ = docs_.data() != nullptr;
  }
  dropout_on_ = training && this->cfg_.dropout > 0;
  const bool bf16 = this->cfg_.bf16();
  aux_value_ = 0;
  if (aux_on_) mark_real_tokens(b.labels);
  const Matrix<Mem> x0 = block_cache(0)[B::kX];
  embedding_forward(exec, dense_vector(embed_), b.tokens, x0);
  if (spec_.embed_scale > 0) embedding_scale(exec, spec_.embed_scale, bf16, x0);
  if (spec_.embed_multiplier > 0) scale_values(exec, spec_.embed_multiplier, bf16, x0);
  if (spec_.ple_width > 0) per_layer_inputs(b.tokens, x0);
  for (int l = 0; l < spec_.layers; ++l) {
    // (kept in bfloat16: each block's input is the one block's, its output goes through x_out)
    const bool last = l + 1 == spec_.layers;
    const Matrix<Mem> next = last || bf16_kept_ ? buf_[B::kXOut] : cache_[l + 1][B::kX];
    const int group = blocks_[l].group;
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
                               with_grads ? buf_[B::kGN] : Matrix<Mem>(), ce_ws_, final_logits(),
                               head_inputs(), HiddenAfter::scratch, buf_[B::kGN]);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::backward(bool accumulate) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  Buffers& s = buf_;
  // (Gemma 4: the layers attending over another's keys and values sum their gradients here)
  if (s[B::kGSharedKV].data()) Kokkos::deep_copy(exec, s[B::kGSharedKV], 0.0f);
  norm_backward(norm_, NormRole::final, s[B::kXOut], s[B::kInvF], s[B::kGN], s[B::kG]);
  if (bf16) round_bf16(exec, s[B::kG]);
  for (int l = spec_.layers - 1; l >= 0; --l) {
    const Block& B = blocks_[l];
    const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
    const int group = B.group;
    this->acquire(group);
    Buffers& c = block_cache(l);
    if (bf16_kept_) restore_bf16(l);  // (before anything reads c)
    if (this->cfg_.activation_checkpointing) block_forward(l, c, Matrix<Mem>());
    // (Gemma 4: the block's output was times its layer_scalar, so is its gradient)
    if (B.layer_scalar) scale_by_scalar(exec, dense_vector(B.layer_scalar), bf16, s[B::kG]);
    if (spec_.ple_width > 0) {  // (g: h' = h + norm(p)'s; h's once the gate's part is in)
      norm_backward(norm_of(NormRole::ple_out), NormRole::ple_out, c[B::kPleRaw], c[B::kInvPle],
                    s[B::kG], s[B::kGTmp]);
      if (bf16) round_bf16(exec, s[B::kGTmp]);
      project_back(l, spec_.writer(Slot::ple_out), c, s[B::kGTmp], accumulate, 0.0f,
                   s[B::kGPleAct]);
      ple_gate_backward(exec, spec_.mlp_activation, bf16, c[B::kPleGate], s[B::kPle],
                        l * spec_.ple_width, s[B::kGPleAct]);
      project_back(l, spec_.writer(Slot::ple_gate), c, s[B::kGPleAct], accumulate, 1.0f, s[B::kG]);
    }
    // MLP: g is the gradient of the block's output (and of mid, through the residual).
    // (a sublayer's output gradient: g times the residual multiplier, then back through
    // the output norm, each rounded in bfloat16; kGTmp holds it)
    const float rm = spec_.residual_multiplier;
    const auto output_gradient = [&](NormRole r, const Matrix<Mem>& raw, const Matrix<Mem>& inv) {
      Matrix<Mem> g = s[B::kG];
      if (rm != 0) {
        scale_values(exec, rm, bf16, g, s[B::kGTmp]);
        g = s[B::kGTmp];
      }
      if (!norm_of(r)) return g;
      // (in place when scaled: the norm's backward reads a row, then writes it)
      norm_backward(norm_of(r), r, raw, inv, g, s[B::kGTmp]);
      if (bf16) round_bf16(exec, s[B::kGTmp]);
      return s[B::kGTmp];
    };
    // (the stream's own gradient, plus an input norm's backward or, without one, its input's)
    const auto input_gradient = [&](NormRole r, const Matrix<Mem>& x, const Matrix<Mem>& inv) {
      if (norm_of(r))
        norm_backward(norm_of(r), r, x, inv, s[B::kGN], s[B::kG], NormGradOut::add);
      else
        residual_add(exec, s[B::kGN], bf16, s[B::kG]);
    };
    const Matrix<Mem> g_down = output_gradient(NormRole::mlp_out, c[B::kDRaw], c[B::kInvD]);
    if (spec_.layer[l].sparse)
      experts_backward(l, c, g_down, accumulate, s[B::kGN]);
    else
      dense_mlp_backward(l, c, g_down, accumulate, s[B::kGN]);
    input_gradient(NormRole::mlp_in, c[B::kMid], c[B::kInv2]);
    // Attention: g is now the gradient of mid (and of the block's input).
    const Matrix<Mem> g_o = output_gradient(NormRole::attn_out, c[B::kORaw], c[B::kInvO]);
    if (spec_.layer[l].mixer == Mixer::linear)
      linear_attention_backward(l, c, g_o, accumulate, l > 0 ? s[B::kGN] : Matrix<Mem>());
    else
      attention_backward(l, c, g_o, accumulate, l > 0 ? s[B::kGN] : Matrix<Mem>());
    if (l > 0) input_gradient(NormRole::attn_in, c[B::kX], c[B::kInv1]);  // (layer 0: none)
    this->release(group);
    this->group_done(group);
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
std::vector<double> CausalLm<ExecSpace>::sequence_logps(const Batch<Mem>& b, bool with_grads,
                                                        std::vector<int64_t>* scored,
                                                        const std::vector<int64_t>* prefix_end,
                                                        std::vector<double>* prefix_logps) {
  // The head's loss over the sequences, undivided: its gradient (kept for backward_weighted)
  // is that of -sum logp, each token's row scaled there by its sequence's weight. (The
  // router's load-balancing loss is no part of it: off in both passes.)
  const bool aux = aux_on_;
  aux_on_ = false;
  forward(b, 1.0, with_grads, with_grads);
  aux_on_ = aux;
  const int64_t n = b.tokens.extent(0);
  // (grown, never shrunk: under lockstep a rank's rows alternate with empty micro-batches,
  // and a device's free would synchronise it inside the step)
  if (static_cast<int64_t>(seq_loss_.extent(0)) < n) {
    seq_loss_ = Kokkos::View<double*, Mem>("kqlora::CausalLm::sequence_loss", n);
    seq_prefix_loss_ = Kokkos::View<double*, Mem>("kqlora::CausalLm::sequence_prefix_loss", n);
    seq_count_ = Kokkos::View<int64_t*, Mem>("kqlora::CausalLm::sequence_count", n);
    seq_prefix_end_ = Kokkos::View<int64_t*, Mem>("kqlora::CausalLm::sequence_prefix_end", n);
  }
  const auto hp = Kokkos::create_mirror_view(seq_prefix_end_);
  for (int64_t s = 0; s < n; ++s) hp(s) = prefix_end ? (*prefix_end)[static_cast<size_t>(s)] : 0;
  Kokkos::deep_copy(this->exec_, seq_prefix_end_, hp);
  sequence_losses(this->exec_, ce_ws_, b.labels, seq_loss_, seq_count_, seq_prefix_end_,
                  seq_prefix_loss_);
  const auto hl = Kokkos::create_mirror_view(seq_loss_);
  const auto hb = Kokkos::create_mirror_view(seq_prefix_loss_);
  const auto hc = Kokkos::create_mirror_view(seq_count_);
  Kokkos::deep_copy(this->exec_, hl, seq_loss_);
  Kokkos::deep_copy(this->exec_, hb, seq_prefix_loss_);
  Kokkos::deep_copy(this->exec_, hc, seq_count_);
  this->exec_.fence();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) out[static_cast<size_t>(s)] = -hl(s);
  if (scored) scored->assign(hc.data(), hc.data() + n);
  if (prefix_logps) {
    prefix_logps->resize(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) (*prefix_logps)[static_cast<size_t>(s)] = -hb(s);
  }
  weighted_rows_ = n;
  weighted_len_ = b.tokens.extent(1);
  weighted_ready_ = with_grads;  // (a forward without gradients overwrote the head's)
  return out;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::backward_weighted(const std::vector<double>& row_weights, bool accumulate,
                                            const std::vector<double>* prefix_weights) {
  KQLORA_CHECK(weighted_ready_,
               "backward_weighted: the last forward was not sequence_logps with gradients");
  KQLORA_CHECK(
      static_cast<int64_t>(row_weights.size()) == weighted_rows_,
      "backward_weighted: " << row_weights.size() << " weights for " << weighted_rows_ << " rows");
  weighted_ready_ = false;
  // (the head's gradient is of -sum logp: token t's row times -w[t / S], or the prefix's
  // weight where its label's position is below the row's prefix_end)
  const size_t n = row_weights.size();
  if (row_w_.extent(0) < 2 * n) {  // (grown once: no allocation inside the step after)
    row_w_ = Kokkos::View<float*, Mem>("kqlora::CausalLm::row_weights", 2 * n);
    row_w_host_ = Kokkos::create_mirror_view(row_w_);
  }
  const auto w = row_w_;
  const auto hw = row_w_host_;
  for (size_t r = 0; r < n; ++r) {
    hw(r) = static_cast<float>(-row_weights[r]);
    hw(n + r) = prefix_weights ? static_cast<float>(-(*prefix_weights)[r]) : 0.0f;
  }
  Kokkos::deep_copy(this->exec_, w, hw);
  const Matrix<Mem> g = buf_[B::kGN];
  const int64_t S = weighted_len_;
  const auto end = seq_prefix_end_;
  const bool bf16 = this->cfg_.bf16();
  Kokkos::parallel_for(
      "kqlora::CausalLm::weight_rows", over(this->exec_, tokens_, g.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const int64_t s = t / S;
        const float v = g(t, f) * (t % S + 1 < end(s) ? w(n + s) : w(s));
        g(t, f) = bf16 ? round_to_bf16(v) : v;
      });
  const bool aux = aux_on_;
  aux_on_ = false;
  backward(accumulate);
  aux_on_ = aux;
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
  const FinalLogits f = final_logits();
  if (f.divisor > 0 || f.softcap > 0)
    Kokkos::parallel_for(
        "kqlora::CausalLm::final_logits", over(this->exec_, out.extent(0), out.extent(1)),
        KOKKOS_LAMBDA(int64_t t, int64_t v) { out(t, v) = f.apply(out(t, v), bf16); });
  return out;
}

template class CausalLm<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
