// Mixtral (MixtralForCausalLM: Mixtral-8x7B, 8x22B): Mistral's attention (no biases, a
// sliding window on every layer when sliding_window is set: MixtralConfig's default is
// none) and a sparse MLP on every layer: num_local_experts experts of intermediate_size, the
// top num_experts_per_tok of a softmax over the router's logits, always renormalised
// (docs/MODELS.md, "Experts"). The hub's names (block_sparse_moe.gate, block_sparse_moe.
// experts.<j>.w1 / w3 / w2 for gate / up / down) and transformers 5's (mlp.gate, the fused
// mlp.experts.gate_up_proj and down_proj) are read alike. router_jitter_noise (training-time
// noise on the router's input) is refused unless 0.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec mixtral_family(HfConfigReader& r, const std::string& model_type) {
  // MixtralConfig's defaults (transformers 5).
  const FamilyDefaults d{32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-5, 1e6, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  s.projections = llama_projections(false, false, false);
  s.norms = pre_norms(NormKind::scale);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3"}));
  const int64_t window = r.integer("sliding_window", 0, false);  // (absent or null: none)
  for (auto& l : s.layer) l.window = window;
  r.require_neutral("router_jitter_noise", 0,
                    "kqlora's router takes no noise (the training-time jitter would make "
                    "runs irreproducible); set it to 0");

  ExpertsSpec& e = s.experts;
  read_router(r, 8, 2, 0.001, e);
  e.intermediate = s.intermediate;  // (Mixtral's experts are intermediate_size wide)
  e.norm_topk = true;               // (MixtralTopKRouter always renormalises)
  e.router = RouterKind::softmax_topk;
  e.router_module = "block_sparse_moe.gate";
  e.experts_module = "block_sparse_moe.experts";
  e.gate_name = "w1";
  e.up_name = "w3";
  e.down_name = "w2";
  for (auto& l : s.layer) l.sparse = true;
  return s;
}

}  // namespace kqlora::impl
