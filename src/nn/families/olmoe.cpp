// OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): Llama's attention with RMSNorms over the whole q
// and k projections (not per head: `self_attn.q_norm` [heads * head_dim], `k_norm`
// [kv_heads * head_dim]) before the rotary, q, k and v clamped to [-clip_qkv, clip_qkv]
// when set, `attention_bias` on q, k, v and o; a sparse MLP on every layer: num_experts
// experts of intermediate_size, the top num_experts_per_tok of a softmax over the
// router's logits, renormalised when norm_topk_prob (docs/MODELS.md, "Experts").
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec olmoe_family(HfConfigReader& r, const std::string& model_type) {
  // OlmoeConfig's defaults (transformers 5).
  const FamilyDefaults d{50304, 2048, 2048, 16, 16, 0, 0, 4096, 1e-5, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  // OlmoeAttention sizes q_norm by hidden_size: another head_dim cannot load there.
  if (s.head_dim * s.heads != s.hidden)
    r.fail("head_dim", "is " + std::to_string(s.head_dim) + "; OLMoE's q_norm is hidden_size " +
                           std::to_string(s.hidden) + " wide, so head_dim must be hidden_size / " +
                           "num_attention_heads = " + std::to_string(s.hidden / s.heads));
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  s.norms = pre_norms(NormKind::scale);
  s.norms.push_back({"self_attn.q_norm", NormRole::q, NormKind::scale, true});
  s.norms.push_back({"self_attn.k_norm", NormRole::k, NormKind::scale, true});
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
  const double clip = r.number("clip_qkv", 0, false);  // (null: none)
  if (r.has("clip_qkv") && !(clip > 0 && clip < 3e38))
    r.fail("clip_qkv", "must be a positive number or null, got " + value_text(*r.get("clip_qkv")));
  s.clip_qkv = static_cast<float>(clip);

  ExpertsSpec& e = s.experts;
  read_router(r, 64, 8, 0.01, e);
  e.intermediate = s.intermediate;  // (OlmoeExperts are intermediate_size wide)
  e.norm_topk = r.boolean("norm_topk_prob", false);
  e.router = RouterKind::softmax_topk;
  for (auto& l : s.layer) l.sparse = true;
  return s;
}

}  // namespace kqlora::impl
