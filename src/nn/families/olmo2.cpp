// OLMo 2 (Olmo2ForCausalLM) and OLMo 3 (Olmo3ForCausalLM): post-norm blocks (no input
// norms: x + norm(attention(x)), then m + norm(mlp(m))), RMSNorms that multiply by their
// weight in float32 and round once, RMSNorms over the whole q and k projections (not per
// head) before the rotary, `attention_bias` on q, k, v and o. OLMo 3: sliding windows on
// the layers `layer_types` names (by default all but every fourth), the rope of its
// full-attention layers scaled (rope_scaling, or rope_parameters keyed by layer type), its
// sliding layers' unscaled.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

namespace {

// OLMo 3's two ropes: ropes[0] for full-attention layers, ropes[1] for sliding ones.
void olmo3_ropes(HfConfigReader& r, double theta, DecoderSpec& s) {
  const std::vector<std::string> allowed = {"linear", "llama3", "yarn"};
  const char* name = nullptr;
  if (rope_object(r, &name) && r.object(name).has("full_attention")) {
    // (transformers 5's rope_parameters, one object per layer type)
    HfConfigReader p = r.object(name);
    for (const char* type : {"full_attention", "sliding_attention"}) {
      if (!p.has(type)) {
        s.ropes.push_back(
            read_rope(r, nullptr, theta, s.head_dim, std::nullopt, s.max_positions, 0, {}));
        continue;
      }
      HfConfigReader q = p.object(type);
      s.ropes.push_back(
          read_rope(r, &q, theta, s.head_dim, std::nullopt, s.max_positions, 0, allowed));
      q.finish();
    }
    p.finish();
  } else {
    // (the hub's rope_theta and rope_scaling: transformers scales the full layers' only)
    s.ropes.push_back(
        read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0, allowed));
    s.ropes.push_back(
        read_rope(r, nullptr, theta, s.head_dim, std::nullopt, s.max_positions, 0, {}));
  }
  for (auto& l : s.layer) l.rope = l.window > 0 ? 1 : 0;
}

DecoderSpec olmo(HfConfigReader& r, const std::string& model_type, bool olmo3) {
  // Olmo2Config's and Olmo3Config's defaults (OLMo 3's rope base 5e5).
  const FamilyDefaults d{50304, 4096, 11008, 32, 32, 0, 0, 2048, 1e-5, olmo3 ? 500000.0 : 10000.0,
                         false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  const NormKind f = NormKind::float32;
  s.norms = {{"post_attention_layernorm", NormRole::attn_out, f},
             {"post_feedforward_layernorm", NormRole::mlp_out, f},
             {"model.norm", NormRole::final, f},
             {"self_attn.q_norm", NormRole::q, f, true},
             {"self_attn.k_norm", NormRole::k, f, true}};
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  if (!olmo3) {
    s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                       {"linear", "llama3", "yarn"}));
    return s;
  }
  const int64_t window = r.integer("sliding_window", 4096, false);
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (int64_t l = 0; l < s.layers; ++l) sliding[static_cast<size_t>(l)] = (l + 1) % 4 != 0;
  read_layer_types(r, window, sliding, s);
  olmo3_ropes(r, theta, s);
  return s;
}

}  // namespace

DecoderSpec olmo2_family(HfConfigReader& r, const std::string& model_type) {
  return olmo(r, model_type, false);
}

DecoderSpec olmo3_family(HfConfigReader& r, const std::string& model_type) {
  return olmo(r, model_type, true);
}

}  // namespace kqlora::impl
