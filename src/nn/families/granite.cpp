// Granite 3.x dense (GraniteForCausalLM): Llama's blocks scaled by four config
// multipliers: embeddings times embedding_multiplier, each sublayer's output times
// residual_multiplier before its residual sum, attention scores times attention_multiplier
// (in place of head_dim^-1/2), logits divided by logits_scaling. Each multiplier is a
// Python float in transformers: unrounded in a bfloat16 run, each product rounded once.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec granite_family(HfConfigReader& r, const std::string& model_type) {
  // GraniteConfig's defaults.
  const FamilyDefaults d{32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  const bool attention_bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(attention_bias, attention_bias, r.boolean("mlp_bias", false));
  s.norms = pre_norms(NormKind::scale);
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
  // (positive and finite in float32; a product by 1 is skipped, 0 in the spec: it is exact)
  const auto multiplier = [&](const char* key, bool one_is_none) {
    const double v = r.number(key, 1.0, false);
    if (!(v > 0 && v < 3e38))
      r.fail(key, "must be a positive number, got " + value_text(*r.get(key)));
    return one_is_none && v == 1.0 ? 0.0f : static_cast<float>(v);
  };
  s.embed_multiplier = multiplier("embedding_multiplier", true);
  s.residual_multiplier = multiplier("residual_multiplier", true);
  s.attn_scale = multiplier("attention_multiplier", false);
  s.logits_divisor = multiplier("logits_scaling", true);
  return s;
}

}  // namespace kqlora::impl
