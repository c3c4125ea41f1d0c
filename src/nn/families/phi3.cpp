// Phi-3, Phi-3.5 and Phi-4-mini (Phi3ForCausalLM): Llama's blocks with fused qkv_proj
// ([q | k | v]) and gate_up_proj ([gate | up]) kept fused as NF4 tensors and LoRA targets,
// partial rotary embeddings, longrope, a sliding window on every layer.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec phi3_family(HfConfigReader& r, const std::string& model_type) {
  const FamilyDefaults d{32064, 3072, 8192, 32, 32, 0, 0, 4096, 1e-5, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  for (const char* key : {"attention_dropout", "resid_pdrop", "embd_pdrop"}) refuse_dropout(r, key);
  // Phi-4-mini's config.json spells out what Phi3ForCausalLM hard-codes: no biases, every
  // layer full (full_attn_mod 1), no interpolation.
  for (const char* key : {"attention_bias", "mlp_bias", "lm_head_bias"})
    r.require_neutral(key, 0, "Phi3ForCausalLM has no biases");
  r.require_neutral("full_attn_mod", 1, "Phi3ForCausalLM attends fully on every layer");
  r.require_neutral("interpolate_factor", 1, "Phi3ForCausalLM does not interpolate");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  using PI = ProjectionInput;
  s.projections = {{"qkv_proj", "self_attn.qkv_proj", PI::attn_norm, {Slot::q, Slot::k, Slot::v}},
                   {"o_proj", "self_attn.o_proj", PI::attn_out, {Slot::o}},
                   {"gate_up_proj", "mlp.gate_up_proj", PI::mlp_norm, {Slot::gate, Slot::up}},
                   {"down_proj", "mlp.down_proj", PI::mlp_act, {Slot::down}}};
  s.norms = pre_norms(NormKind::scale);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  const double partial = r.number("partial_rotary_factor", 1.0, false);
  if (!(partial > 0 && partial <= 1))
    r.fail("partial_rotary_factor", "must be in (0, 1], got " + std::to_string(partial));
  // (transformers copies the top-level value into the rope object: it wins)
  const int64_t original = r.integer("original_max_position_embeddings", 4096, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, partial, s.max_positions, original,
                                     {"longrope", "su", "yarn"}));
  const int64_t window = r.integer("sliding_window", 0, false);
  for (auto& l : s.layer) l.window = window;
  return s;
}

}  // namespace kqlora::impl
