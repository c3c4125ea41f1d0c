// The decoder's parameter table (CausalLm::make_table): every tensor of a spec's layers
// by Hugging Face's name, its adapters, its groups (docs/MODELS.md, "Names and groups").
#include <array>

#include "decoder_names.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/causal_lm.hpp"

namespace kqlora {

namespace {

using decoder::expert_weight_name;
using decoder::layer_prefix;
using decoder::norm_name;

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
    // (what kqlora-export and a PEFT init_file read: PEFT's module and parameter)
    ExpertAdapter ad;
    ad.module = g + "." + x.fused_module;
    ad.parameter = w == 0 ? "gate_up_proj" : "down_proj";
    ad.target = x.fused_module + "." + ad.parameter;
    ad.inner = w == 0 && on[1];  // (PEFT wraps the module's parameters in their order)
    ad.interleaved = w == 0 && x.layout == ExpertsSpec::Layout::interleaved;
    ad.a = name + ".lora_a.weight";
    ad.b = name + ".lora_b.weight";
    for (int64_t j = 0; j < E; ++j)
      for (int k = w == 0 ? 0 : 2; k <= (w == 0 ? 1 : 2); ++k)
        ad.bases.push_back(expert_weight_name(s, g, j, k));
    ad.experts = E;
    ad.rank = r;
    ad.out = out;
    ad.in = in;
    ad.alpha = cfg.alpha;
    t.expert_adapters.push_back(ad);
  }
}

/// Where expert j's weight w (gate, up, down) of a model file may be besides its hub
/// name: transformers 5's fused rows, or gpt-oss's interleaved transposes (plain, then
/// MXFP4: a fused base written by kqlora-export takes the first).
std::vector<TensorSlice> fused_expert_slices(const ExpertsSpec& x, const std::string& m, int64_t H,
                                             int64_t j, int w) {
  const int64_t I = x.intermediate;
  const std::string name = m + (w < 2 ? ".gate_up_proj" : ".down_proj");
  if (x.layout == ExpertsSpec::Layout::rows)
    return {
        {name,
         w < 2 ? std::vector<int64_t>{x.experts, 2 * I, H} : std::vector<int64_t>{x.experts, H, I},
         w < 2 ? (j * 2 * I + w * I) * H : j * H * I}};
  // gpt-oss: gate_up_proj [E, H, 2I] (gate i in column 2i, up i in 2i + 1), down_proj
  // [E, I, H]: the transposes of [out, in]; MXFP4 stores them untransposed ([E, 2I, H]
  // with gate i in row 2i; [E, H, I]).
  if (w < 2)
    return {{name, {x.experts, H, 2 * I}, j * H * 2 * I + w, 2, 2 * I, false},
            {name, {x.experts, 2 * I, H}, j * 2 * I * H + w * H, 2 * H, 1, true}};
  return {{name, {x.experts, I, H}, j * I * H, 1, H, false},
          {name, {x.experts, H, I}, j * H * I, I, 1, true}};
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
  t.file_prefix = s.file_prefix;
  t.skipped_prefixes = s.skipped;
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
      const int64_t out = s.out_features(proj, l), in = s.in_features(proj, l);
      const std::string m = g + "." + s.module_of(l, proj);
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
        add_nf4(g + "." + s.module_of(l, proj) + ".weight",
                {s.out_features(proj, l), s.in_features(proj, l)});
    const bool sparse = s.layer[static_cast<size_t>(l)].sparse;
    if (sparse)
      for (const std::string& m : {s.experts.experts_module, s.experts.fused_module})
        if (t.owned_prefixes.empty() || t.owned_prefixes.back() != g + "." + m + ".")
          t.owned_prefixes.push_back(g + "." + m + ".");
    if (sparse) {  // every expert's gate, up and down in NF4, one tensor each
      const ExpertsSpec& x = s.experts;
      const int64_t E = x.experts, I = x.intermediate, H = s.hidden;
      const std::string m = g + "." + x.fused_module;
      for (int64_t j = 0; j < E; ++j)
        for (int w = 0; w < 3; ++w) {
          add_nf4(expert_weight_name(s, g, j, w),
                  w < 2 ? std::vector<int64_t>{I, H} : std::vector<int64_t>{H, I});
          t.entries.back().alts = fused_expert_slices(x, m, H, j, w);
        }
      if (x.expert_bias) {  // (gpt-oss: gate's and up's interleaved in gate_up_proj_bias)
        for (int w = 0; w < 2; ++w) {
          add_dense(m + (w == 0 ? ".gate_proj_bias" : ".up_proj_bias"), {E, I}, g);
          t.entries.back().alts = {{m + ".gate_up_proj_bias", {E, 2 * I}, w, 2 * I, 2, false}};
        }
        add_dense(m + ".down_proj_bias", {E, H}, g);
      }
    }
    for (const ProjectionSpec& proj : s.projections)
      if (proj.bias && s.has_projection(l, proj))
        add_dense(g + "." + s.module_of(l, proj) + ".bias", {s.out_features(proj, l)}, g);
    const bool linear = s.layer[static_cast<size_t>(l)].mixer == Mixer::linear;
    if (s.sinks && !linear) add_dense(g + ".self_attn.sinks", {s.heads}, g);
    if (linear) {  // (a Gated DeltaNet layer's frozen conv, decay parameters and norm)
      const LinearAttentionSpec& L = s.linear;
      const std::string m = g + "." + L.module;
      add_dense(m + ".conv1d.weight", {L.conv_width(), 1, L.kernel}, g);
      add_dense(m + ".dt_bias", {L.value_heads}, g);
      add_dense(m + ".A_log", {L.value_heads}, g);
      add_dense(m + ".norm.weight", {L.value_dim}, g);
    }
    // (the router in the run's dtype, as transformers computes its logits: frozen, and a
    // few E x hidden values whose rounding to NF4 could flip which experts a token gets)
    if (sparse) {
      add_dense(g + "." + s.experts.router_module + ".weight", {s.experts.experts, s.hidden}, g);
      if (s.experts.fused_router != s.experts.router_module) {  // (transformers 5's name)
        ParamEntry& e = t.entries.back();
        e.alts = {{g + "." + s.experts.fused_router + ".weight", e.shape}};
      }
      if (s.experts.router_bias)
        add_dense(g + "." + s.experts.router_module + ".bias", {s.experts.experts}, g);
      if (s.shared_expert(l))  // (its gate dense as the router, for the same reasons)
        add_dense(g + "." + s.experts.shared_gate_module + ".weight", {1, s.hidden}, g);
      if (!s.experts.router_scale.empty()) {  // (Gemma 4's router input scale, expert scales)
        add_dense(g + "." + s.experts.router_scale, {s.hidden}, g);
        add_dense(g + "." + s.experts.per_expert_scale, {s.experts.experts}, g);
      }
    }
    for (const NormSpec& n : s.norms)
      if (n.role != NormRole::final && n.role != NormRole::ple_proj && n.kind != NormKind::unit &&
          decoder::layer_has_norm(s, l, n))
        add_dense(norm_name(n, g), {s.norm_width(n, l)}, g);
    if (s.layer_scalar) add_dense(g + ".layer_scalar", {1}, g);
  }
  if (s.ple_width > 0) {  // (Gemma 4's per-layer inputs: frozen, nn/per_layer_input.hpp)
    const int64_t LP = s.layers * s.ple_width;
    add_dense("model.embed_tokens_per_layer.weight", {s.ple_vocab, LP}, "embed");
    // (read only by lookups: held in 16 bits where its values are bfloat16 ones)
    if (s.ple_table_bf16) t.entries.back().dtype = DType::bfloat16;
    t.entries.back().compact = t.entries.back().dtype == DType::bfloat16;
    ParamEntry e;
    e.name = "model.per_layer_model_projection.weight";
    e.shape = {LP, s.hidden};
    e.kind = ParamKind::nf4;
    e.dtype = cfg.dtype;
    e.block_size = cfg.block_size;
    e.scaler_block_size = cfg.scaler_block_size;
    e.init.dist = Dist::file;
    t.add(e, "embed");
    add_dense("model.per_layer_projection_norm.weight", {s.ple_width}, "embed");
  }
  add_dense(norm_name(*s.norm(NormRole::final), ""), {s.hidden}, "head");
  if (!s.tied) add_dense("lm_head.weight", {s.vocab, s.hidden}, "head");
  return t;
}

// (this file's members of the one instantiation, causal_lm.cpp)
template ParamTable CausalLm<Kokkos::DefaultExecutionSpace>::make_table(const ModelConfig&);

}  // namespace kqlora
