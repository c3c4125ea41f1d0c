// Qwen3.5-MoE's text decoder (Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text; the hub's
// multimodal qwen3_5_moe directories through qwen3_5.cpp): Qwen3.5's hybrid layers (Gated
// DeltaNet and gated full attention by layer_types) with a sparse MLP on every layer:
// num_experts experts of moe_intermediate_size, the top num_experts_per_tok of a softmax
// always renormalised, beside a shared expert of shared_expert_intermediate_size gated
// per token by sigmoid(shared_expert_gate(x)) (docs/MODELS.md, "Experts" and "Gated
// DeltaNet"). Qwen3_5MoeTextConfig has no dense MLP, decoder_sparse_step, mlp_only_layers
// or norm_topk_prob.
#include <algorithm>
#include <string>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec qwen3_5_moe_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen3_5MoeTextConfig's defaults (transformers 5.25; intermediate_size: none, the
  // shared expert's width stands in for the dense MLP's).
  const FamilyDefaults d{248320, 2048, 512, 40, 16, 2, 256, 32768, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  // (Qwen3_5MoeTextConfig removes these fields; a file that sets them is loaded with
  // them ignored: kqlora accepts the values transformers computes with, refuses others)
  const std::string ignored = "transformers' Qwen3.5-MoE ignores it: every layer is sparse";
  r.require_neutral("decoder_sparse_step", 1, ignored);
  r.require_neutral("norm_topk_prob", 1, "transformers' Qwen3.5-MoE always renormalises");
  if (!r.numbers("mlp_only_layers").empty())
    r.fail("mlp_only_layers", "is " + value_text(*r.get("mlp_only_layers")) + "; " + ignored);
  qwen3_5_hybrid(r, d, false, s);  // (reads intermediate_size, replaced below)
  ExpertsSpec& e = s.experts;
  read_router(r, 256, 8, 0.001, e);
  e.intermediate = r.integer("moe_intermediate_size", 512, false);
  e.shared_intermediate = r.integer("shared_expert_intermediate_size", 512, false);
  e.norm_topk = true;
  e.router = RouterKind::softmax_topk;
  s.intermediate = e.shared_intermediate;
  s.notes.erase(
      std::remove_if(s.notes.begin(), s.notes.end(),
                     [](const std::string& n) { return n.rfind("intermediate_size", 0) == 0; }),
      s.notes.end());
  if (r.has("intermediate_size"))
    s.notes.push_back("intermediate_size: unused (Qwen3.5-MoE has no dense MLP)");
  for (LayerSpec& l : s.layer) l.sparse = true;
  return s;
}

}  // namespace kqlora::impl
