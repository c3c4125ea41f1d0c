// Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention
// (biases on q, k, v when qkv_bias, none on o; a sliding window on the even layers below
// max_window_layers when use_sliding_window, or as layer_types says) and, on the layers
// decoder_sparse_step and mlp_only_layers make sparse, num_experts experts of
// moe_intermediate_size (the top num_experts_per_tok of a softmax, renormalised when
// norm_topk_prob) beside a shared expert of shared_expert_intermediate_size gated per token
// by sigmoid(shared_expert_gate(x)) (docs/MODELS.md, "Experts"). The other layers have
// Qwen2's dense MLP of intermediate_size.
#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec qwen2_moe_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen2MoeConfig's defaults (transformers 5).
  const FamilyDefaults d{151936, 2048, 5632, 24, 16, 16, 0, 32768, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  qwen2_attention(r, d, r.boolean("qkv_bias", true), s);
  // transformers: layer l slides when l is even, below max_window_layers and
  // use_sliding_window (or as layer_types says).
  const bool use_window = r.boolean("use_sliding_window", false);
  // (Qwen2MoeConfig saves sliding_window 0 when use_sliding_window is false)
  const int64_t window = r.integer("sliding_window", 4096, false, use_window ? 1 : 0);
  const int64_t max_window_layers = r.integer("max_window_layers", 28, false, 0);
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (int64_t l = 0; l < s.layers; ++l)
    sliding[static_cast<size_t>(l)] = use_window && l % 2 == 0 && l < max_window_layers;
  read_layer_types(r, use_window ? window : 0, sliding, s,
                   use_window ? nullptr : "use_sliding_window is false");

  ExpertsSpec& e = s.experts;
  read_router(r, 60, 4, 0.001, e);
  e.intermediate = r.integer("moe_intermediate_size", 1408, false);
  e.shared_intermediate = r.integer("shared_expert_intermediate_size", 5632, false);
  e.norm_topk = r.boolean("norm_topk_prob", false);
  e.router = RouterKind::softmax_topk;
  read_sparse_layers(r, s);
  return s;
}

}  // namespace kqlora::impl
