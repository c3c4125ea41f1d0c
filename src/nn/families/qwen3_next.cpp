// Qwen3-Next (Qwen3NextForCausalLM: Qwen3-Next-80B-A3B): Qwen3.5's hybrid layers (Gated
// DeltaNet and gated full attention by layer_types or full_attention_interval) whose
// Gated DeltaNet reads two fused projections, in_proj_qkvz and in_proj_ba, their columns
// per key head group ([q_h | k_h | v_h | z_h], [b_h | a_h]: the value heads of key head h
// together); the MLP as Qwen2-MoE's: sparse on the layers decoder_sparse_step and
// mlp_only_layers make so (num_experts experts of moe_intermediate_size, the top
// num_experts_per_tok of a softmax, renormalised when norm_topk_prob) beside a shared
// expert gated by sigmoid(shared_expert_gate(x)), the others a dense MLP of
// intermediate_size (docs/MODELS.md, "Experts" and "Gated DeltaNet").
#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec qwen3_next_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen3NextConfig's defaults (transformers 5.25).
  const FamilyDefaults d{151936, 2048, 5632, 48, 16, 2, 256, 32768, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  qwen3_5_hybrid(r, d, true, s);
  ExpertsSpec& e = s.experts;
  read_router(r, 512, 10, 0.001, e);
  e.intermediate = r.integer("moe_intermediate_size", 512, false);
  e.shared_intermediate = r.integer("shared_expert_intermediate_size", 512, false);
  e.norm_topk = r.boolean("norm_topk_prob", true);
  e.router = RouterKind::softmax_topk;
  read_sparse_layers(r, s);
  return s;
}

}  // namespace kqlora::impl
