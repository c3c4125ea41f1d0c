// gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b): attention with biases on q, k, v
// and o, a learned sink logit per head, sliding and full layers as layer_types says (by
// default alternating, sliding first), YaRN rope; RMSNorms that multiply by their weight in
// float32 and round once; a sparse MLP on every layer: num_local_experts experts of
// intermediate_size, the top num_experts_per_tok router logits (a router with a bias) then a
// softmax over them, each expert's products with biases and the clamped SwiGLU
// (swiglu_alpha, swiglu_limit). The experts are read from the hub's MXFP4 blocks and scales
// or transformers 5's interleaved [E, hidden, 2I] gate_up_proj (docs/MODELS.md, "Experts").
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec gpt_oss_family(HfConfigReader& r, const std::string& model_type) {
  // GptOssConfig's defaults (transformers 5).
  const FamilyDefaults d{201088, 2880, 2880, 36, 64, 8, 64, 131072, 1e-5, 150000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  // (GptOssExperts applies its clamped SwiGLU whatever hidden_act says; the hub writes silu)
  read_activation(r, "hidden_act", "silu", false);  // (checked: silu, or refused)
  const bool bias = r.boolean("attention_bias", true);
  s.projections = llama_projections(bias, bias, false);
  s.norms = pre_norms(NormKind::float32);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  s.sinks = true;
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(
      read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0, {"yarn", "linear"}));
  // (null: transformers gives the sliding layers no window; absent: GptOssConfig's 128)
  const int64_t window = r.present("sliding_window") && !r.has("sliding_window")
                             ? 0
                             : r.integer("sliding_window", 128, false);
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (size_t l = 0; l < sliding.size(); ++l) sliding[l] = l % 2 == 0;  // (GptOssConfig's)
  read_layer_types(r, window, sliding, s, "sliding_window is null");
  r.accept({"initial_context_length"});  // (the hub's; transformers keeps it unused)
  if (r.has("quantization_config")) {    // (the hub's MXFP4 experts: read and decoded here)
    HfConfigReader q = r.object("quantization_config");
    const std::string method = q.string("quant_method", "", true);
    if (method != "mxfp4")
      q.fail("quant_method",
             "is " + json::quote(method) +
                 "; kqlora reads gpt-oss's \"mxfp4\" experts (or unquantized ones)");
    q.accept({"modules_to_not_convert", "dequantize"});
    q.finish();
  }

  ExpertsSpec& e = s.experts;
  read_router(r, 128, 4, 0.001, e);
  const int64_t per_token = r.integer("experts_per_token", e.top_k, false);
  if (per_token != e.top_k)
    r.fail("experts_per_token", "is " + std::to_string(per_token) + " but num_experts_per_tok is " +
                                    std::to_string(e.top_k) +
                                    " (the hub writes both; they must agree)");
  e.intermediate = s.intermediate;  // (GptOssExperts are intermediate_size wide)
  e.router = RouterKind::topk_softmax;
  e.router_module = "mlp.router";
  e.fused_router = "mlp.router";
  e.router_bias = true;
  e.expert_bias = true;
  e.layout = ExpertsSpec::Layout::interleaved;
  e.swiglu_alpha = static_cast<float>(r.number("swiglu_alpha", 1.702, false));
  e.swiglu_limit = static_cast<float>(r.number("swiglu_limit", 7.0, false));
  if (!(e.swiglu_limit > 0 && std::isfinite(e.swiglu_limit)))
    r.fail("swiglu_limit", "must be a positive number, got " + value_text(*r.get("swiglu_limit")));
  if (!(e.swiglu_alpha > 0 && std::isfinite(e.swiglu_alpha)))
    r.fail("swiglu_alpha", "must be a positive number, got " + value_text(*r.get("swiglu_alpha")));
  for (auto& l : s.layer) l.sparse = true;
  return s;
}

}  // namespace kqlora::impl
