// Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM, model_type
// gemma3_text): Gemma's (1 + w) RMSNorms in float32 around both sublayers (sandwich
// norms), tanh-GELU gated MLP, embeddings times sqrt(hidden), attention scaled by
// query_pre_attn_scalar^-1/2, attention and final-logit soft-caps, sliding-window layers;
// Gemma 3: per-head q/k norms and a local rope base on its sliding layers.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

namespace {

DecoderSpec gemma(HfConfigReader& r, const std::string& model_type, bool gemma3) {
  // Gemma2Config's and Gemma3TextConfig's defaults.
  const FamilyDefaults d =
      gemma3 ? FamilyDefaults{262208, 2304, 9216, 26, 8, 4, 256, 131072, 1e-6, 1000000.0, true}
             : FamilyDefaults{256000, 2304, 9216, 26, 8, 4, 256, 8192, 1e-6, 10000.0, true};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  r.accept({"cache_implementation", "hidden_act"});  // (Gemma's MLP reads hidden_activation)
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_activation", "gelu_pytorch_tanh", true);
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  const NormKind g = NormKind::one_plus;
  s.norms = {{"input_layernorm", NormRole::attn_in, g},
             {"post_attention_layernorm", NormRole::attn_out, g},
             {"pre_feedforward_layernorm", NormRole::mlp_in, g},
             {"post_feedforward_layernorm", NormRole::mlp_out, g},
             {"model.norm", NormRole::final, g}};
  if (gemma3) {
    s.norms.push_back({"self_attn.q_norm", NormRole::q, g});
    s.norms.push_back({"self_attn.k_norm", NormRole::k, g});
  }
  if (r.boolean("use_bidirectional_attention", false))
    r.fail("use_bidirectional_attention", "is true; kqlora's attention is causal");
  s.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(s.hidden)));
  const double qpas = r.number("query_pre_attn_scalar", 256, false);
  if (!(qpas > 0)) r.fail("query_pre_attn_scalar", "must be > 0");
  s.attn_scale = static_cast<float>(std::pow(qpas, -0.5));
  auto softcap = [&](const char* key, double fallback) {
    const double v = r.present(key) ? r.number(key, 0, false) : fallback;
    // (0 is not "none": transformers divides by it; null is none)
    if (r.has(key) && !(v > 0))
      r.fail(key, "must be > 0 or null (no soft-cap), got " + value_text(*r.get(key)));
    return static_cast<float>(v);
  };
  s.attn_softcap = softcap("attn_logit_softcapping", gemma3 ? 0.0 : 50.0);
  if (gemma3 && s.attn_softcap > 0)  // (transformers' Gemma 3 attention never applies it)
    r.fail("attn_logit_softcapping",
           "is " + value_text(*r.get("attn_logit_softcapping")) +
               "; transformers' Gemma 3 does not apply it, so kqlora refuses rather than "
               "compute other numbers (set it to null)");
  s.final_softcap = softcap("final_logit_softcapping", gemma3 ? 0.0 : 30.0);
  const int64_t window = r.integer("sliding_window", 4096, false);
  // (Gemma 2 9B's config.json repeats it; transformers reads sliding_window only)
  if (r.has("sliding_window_size") && r.integer("sliding_window_size", 0, true) != window)
    r.fail("sliding_window_size", "is " + value_text(*r.get("sliding_window_size")) +
                                      " but sliding_window is " + std::to_string(window));
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  // Gemma 2: every other layer from the first; Gemma 3: all but every pattern-th.
  // (save_pretrained also writes a private _sliding_window_pattern, which transformers
  // does not read back: layer_types decides)
  r.accept({"_sliding_window_pattern"});
  const int64_t pattern = gemma3 ? r.integer("sliding_window_pattern", 6, false) : 2;
  for (int64_t l = 0; l < s.layers; ++l) sliding[l] = (l + 1) % pattern != 0;
  read_layer_types(r, window, sliding, s);

  const double theta = r.number("rope_theta", d.rope_theta, false);
  // Gemma 3: ropes[0] for full-attention layers (rope_theta, rope_scaling), ropes[1] for
  // sliding ones (rope_local_base_freq, unscaled); or rope_parameters keyed by layer type.
  const double local = gemma3 ? r.number("rope_local_base_freq", 10000.0, false) : 0.0;
  const char* name = nullptr;
  if (!gemma3 || !rope_object(r, &name) || !r.object(name).has("full_attention")) {
    s.ropes.push_back(
        read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0, {"linear"}));
    if (!gemma3) return s;
    s.ropes.push_back(
        read_rope(r, nullptr, local, s.head_dim, std::nullopt, s.max_positions, 0, {}));
  } else {
    HfConfigReader p = r.object(name);
    for (const char* type : {"full_attention", "sliding_attention"}) {
      const double base = type[0] == 'f' ? theta : local;
      if (!p.has(type)) {
        s.ropes.push_back(
            read_rope(r, nullptr, base, s.head_dim, std::nullopt, s.max_positions, 0, {}));
        continue;
      }
      HfConfigReader q = p.object(type);
      s.ropes.push_back(
          read_rope(r, &q, base, s.head_dim, std::nullopt, s.max_positions, 0, {"linear"}));
      q.finish();
    }
    p.finish();
  }
  for (auto& l : s.layer) l.rope = l.window > 0 ? 1 : 0;
  return s;
}

}  // namespace

DecoderSpec gemma2_family(HfConfigReader& r, const std::string& model_type) {
  return gemma(r, model_type, false);
}

DecoderSpec gemma3_family(HfConfigReader& r, const std::string& model_type) {
  return gemma(r, model_type, true);
}

}  // namespace kqlora::impl
