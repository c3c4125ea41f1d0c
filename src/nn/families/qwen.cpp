// Qwen2 / Qwen2.5 (Qwen2ForCausalLM) and Qwen3 (Qwen3ForCausalLM): Llama's blocks with
// q/k/v biases (Qwen2) or per-head q/k RMSNorms before the rotary and `attention_bias` on
// q, k, v and o (Qwen3); sliding windows on the layers `layer_types` names, or by default
// on layers from max_window_layers on when use_sliding_window is set.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

void qwen3_attention(HfConfigReader& r, const FamilyDefaults& d, DecoderSpec& s) {
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  s.norms = pre_norms(NormKind::scale);
  s.norms.push_back({"self_attn.q_norm", NormRole::q, NormKind::scale});
  s.norms.push_back({"self_attn.k_norm", NormRole::k, NormKind::scale});
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
}

void qwen2_attention(HfConfigReader& r, const FamilyDefaults& d, bool qkv_bias, DecoderSpec& s) {
  s.projections = llama_projections(qkv_bias, false, false);
  s.norms = pre_norms(NormKind::scale);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
}

namespace {

DecoderSpec qwen(HfConfigReader& r, const std::string& model_type, bool qwen3) {
  // Qwen2Config's and Qwen3Config's defaults (Qwen3: head_dim 128).
  const FamilyDefaults d{151936,          4096,  22016, 32,      32,   32,
                         qwen3 ? 128 : 0, 32768, 1e-6,  10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  if (qwen3)
    qwen3_attention(r, d, s);
  else
    qwen2_attention(r, d, true, s);
  // transformers: sliding_window = sliding_window if use_sliding_window else None; a layer
  // slides when its layer_types entry says so (default: from max_window_layers on).
  const bool use_window = r.boolean("use_sliding_window", false);
  const int64_t window = r.integer("sliding_window", 4096, false);  // (Qwen2Config's)
  const int64_t max_window_layers = r.integer("max_window_layers", 28, false, 0);
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (int64_t l = 0; l < s.layers; ++l) sliding[l] = use_window && l >= max_window_layers;
  read_layer_types(r, use_window ? window : 0, sliding, s,
                   use_window ? nullptr : "use_sliding_window is false");
  return s;
}

}  // namespace

DecoderSpec qwen2_family(HfConfigReader& r, const std::string& model_type) {
  return qwen(r, model_type, false);
}

DecoderSpec qwen3_family(HfConfigReader& r, const std::string& model_type) {
  return qwen(r, model_type, true);
}

}  // namespace kqlora::impl
