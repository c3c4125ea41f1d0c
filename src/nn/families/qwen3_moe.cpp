// Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-
// head q/k norms, attention_bias on q, k, v and o) and a sparse MLP on every layer l with
// (l + 1) % decoder_sparse_step == 0 not in mlp_only_layers: num_experts experts of
// moe_intermediate_size, num_experts_per_tok of them per token by a softmax over all the
// router's logits then the top k, renormalised when norm_topk_prob (docs/MODELS.md,
// "Experts"). The other layers have Qwen3's dense MLP of intermediate_size. A sliding
// window, when use_sliding_window, on every layer (Qwen3MoeConfig has no layer_types).
#include <cmath>
#include <sstream>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec qwen3_moe_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen3MoeConfig's defaults (transformers 5).
  const FamilyDefaults d{151936, 2048, 6144, 24, 32, 4, 128, 32768, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  qwen3_attention(r, d, s);
  const bool use_window = r.boolean("use_sliding_window", false);
  const int64_t window = r.integer("sliding_window", 4096, false);
  for (auto& l : s.layer) l.window = use_window ? window : 0;
  r.accept({"max_window_layers"});  // (written by older files; Qwen3MoeAttention ignores it)

  ExpertsSpec& e = s.experts;
  // (0 experts would make a dense Qwen3 in transformers: a model_type of its own here)
  read_router(r, 128, 8, 0.001, e);  // (the hub's files say num_experts)
  e.intermediate = r.integer("moe_intermediate_size", 768, false);
  e.norm_topk = r.boolean("norm_topk_prob", false);
  e.router = RouterKind::softmax_topk;
  read_sparse_layers(r, s);
  return s;
}

}  // namespace kqlora::impl
