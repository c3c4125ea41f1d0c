// Llama (LlamaForCausalLM) and Mistral (MistralForCausalLM): pre-norm blocks of Llama's
// RMSNorm, SiLU-gated MLP, optional biases, rope default / linear / llama3; Mistral's
// sliding window on every layer.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec llama_family(HfConfigReader& r, const std::string& model_type) {
  const bool mistral = model_type == "mistral";
  // LlamaConfig's and MistralConfig's defaults.
  const FamilyDefaults d =
      mistral ? FamilyDefaults{32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-6, 10000.0, false}
              : FamilyDefaults{32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  // (a training-time sharding hint; SmolLM2's markers and transformers.js settings)
  r.accept({"pretraining_tp", "is_llama_config", "transformers.js_config"});
  r.require_neutral("rope_interleaved", 0, "kqlora's rotary is Hugging Face's rotate-half");
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  // (MistralAttention has no biases whatever the config says)
  if (mistral) r.require_neutral("attention_bias", 0, "MistralForCausalLM has no biases");
  const bool attention_bias = !mistral && r.boolean("attention_bias", false);
  const bool mlp_bias = !mistral && r.boolean("mlp_bias", false);
  s.projections = llama_projections(attention_bias, attention_bias, mlp_bias);
  s.norms = pre_norms(NormKind::scale);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
  if (mistral) {
    // (absent: MistralConfig's 4096; null: none)
    const int64_t window =
        r.present("sliding_window") ? r.integer("sliding_window", 0, false) : int64_t(4096);
    for (auto& l : s.layer) l.window = window;
  }
  return s;
}

}  // namespace kqlora::impl
