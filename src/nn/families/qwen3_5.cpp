// Qwen3.5's text decoder (Qwen3_5ForCausalLM, model_type qwen3_5_text): Gated DeltaNet
// layers (linear_attention) and gated full-attention layers (full_attention) by
// `layer_types` (default: every full_attention_interval-th layer full, 4); every RMSNorm
// zero-centred ((1 + w) n in float32), the q/k norms per head too; the attention's q_proj
// writes [q_h | gate_h] per head and its output is multiplied by sigmoid(gate); partial
// rotary (partial_rotary_factor, default 0.25); mrope_section and mrope_interleaved are
// accepted: on text alone the three position streams are equal and mrope is 1-D rope
// (docs/MODELS.md, "Gated DeltaNet").
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"
#include "kqlora/core/json.hpp"

namespace kqlora::impl {

namespace {

// The rope object's mrope fields: accepted, checked for shape (they change nothing on text).
void accept_mrope(HfConfigReader& p, int64_t rotary_dim) {
  if (p.has("mrope_section")) {
    const std::vector<double> sec = p.numbers("mrope_section");
    double sum = 0;
    for (double x : sec) {
      if (!(x >= 0 && x == std::floor(x)))
        p.fail("mrope_section",
               "must be non-negative integers, got " + value_text(*p.get("mrope_section")));
      sum += x;
    }
    if (sec.size() != 3 || static_cast<int64_t>(sum) != rotary_dim / 2)
      p.fail("mrope_section",
             "must be 3 integers summing to rotary_dim / 2 = " + std::to_string(rotary_dim / 2) +
                 ", got " + value_text(*p.get("mrope_section")));
  }
  p.boolean("mrope_interleaved", false);
}

}  // namespace

void qwen3_5_hybrid(HfConfigReader& r, const FamilyDefaults& d, bool fused, DecoderSpec& s) {
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  LinearAttentionSpec& L = s.linear;
  L.key_heads = r.integer("linear_num_key_heads", 16, false);
  L.value_heads = r.integer("linear_num_value_heads", 32, false);
  L.key_dim = r.integer("linear_key_head_dim", 128, false);
  L.value_dim = r.integer("linear_value_head_dim", 128, false);
  L.kernel = r.integer("linear_conv_kernel_dim", 4, false);
  if (L.value_heads % L.key_heads != 0)
    r.fail("linear_num_value_heads",
           "is " + std::to_string(L.value_heads) + ", not a multiple of linear_num_key_heads " +
               std::to_string(L.key_heads) + " (each key head serves value heads alike)");
  bound_linear_sizes(r, L, s.hidden);
  // (the Gated DeltaNet layers' projections: PEFT's names, no biases)
  using PI = ProjectionInput;
  if (fused) {  // Qwen3-Next: two projections whose columns go per key head group
    s.projections.push_back({"in_proj_qkvz",
                             "linear_attn.in_proj_qkvz",
                             PI::attn_norm,
                             {Slot::lin_qkv, Slot::lin_z},
                             false,
                             L.key_heads});
    s.projections.push_back({"in_proj_ba",
                             "linear_attn.in_proj_ba",
                             PI::attn_norm,
                             {Slot::lin_b, Slot::lin_a},
                             false,
                             L.key_heads});
  } else {
    s.projections.push_back(
        {"in_proj_qkv", "linear_attn.in_proj_qkv", PI::attn_norm, {Slot::lin_qkv}});
    s.projections.push_back({"in_proj_z", "linear_attn.in_proj_z", PI::attn_norm, {Slot::lin_z}});
    s.projections.push_back({"in_proj_b", "linear_attn.in_proj_b", PI::attn_norm, {Slot::lin_b}});
    s.projections.push_back({"in_proj_a", "linear_attn.in_proj_a", PI::attn_norm, {Slot::lin_a}});
  }
  s.projections.push_back({"out_proj", "linear_attn.out_proj", PI::linear_out, {Slot::lin_out}});
  s.norms = pre_norms(NormKind::one_plus);
  s.norms.push_back({"self_attn.q_norm", NormRole::q, NormKind::one_plus});
  s.norms.push_back({"self_attn.k_norm", NormRole::k, NormKind::one_plus});
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  // transformers always gates the attention output (the hub's configs say so too)
  r.require_neutral("attn_output_gate", 1, "transformers' Qwen3.5 attention always gates");
  s.attn_output_gate = true;

  // The rope: rope_parameters (or rope_scaling) with partial_rotary_factor and mrope.
  const double theta = r.number("rope_theta", d.rope_theta, false);
  const double partial = r.number("partial_rotary_factor", 0.25, false);
  const char* name = nullptr;
  if (rope_object(r, &name)) {
    HfConfigReader p = r.object(name);
    s.ropes.push_back(read_rope(r, &p, theta, s.head_dim, partial, s.max_positions, 0, {}));
    accept_mrope(p, s.ropes.back().rotary_dim);
    p.finish();
  } else {
    s.ropes.push_back(read_rope(r, nullptr, theta, s.head_dim, partial, s.max_positions, 0, {}));
  }

  // layer_types: one of linear_attention / full_attention a layer (default: every
  // full_attention_interval-th full).
  const int64_t interval = r.integer("full_attention_interval", 4, false);
  const auto types = r.strings("layer_types");
  if (!types.empty() && static_cast<int64_t>(types.size()) != s.layers)
    r.fail("layer_types", "has " + std::to_string(types.size()) + " entries for " +
                              std::to_string(s.layers) + " layers");
  for (int64_t l = 0; l < s.layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    bool linear = (l + 1) % interval != 0;
    if (!types.empty()) {
      if (types[i] != "linear_attention" && types[i] != "full_attention")
        r.fail("layer_types", "entry " + std::to_string(l) + " is " + json::quote(types[i]) +
                                  "; supported: \"linear_attention\", \"full_attention\"");
      linear = types[i] == "linear_attention";
    }
    s.layer[i].mixer = linear ? Mixer::linear : Mixer::attention;
  }
  // (the multi-token prediction head: not trained, its fields read and left out)
  r.accept({"mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"});
}

DecoderSpec qwen3_5_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen3_5TextConfig's defaults (transformers 5.25).
  const FamilyDefaults d{248320, 4096, 12288, 32, 16, 4, 256, 32768, 1e-6, 10000.0, false};
  DecoderSpec s;
  s.model_type = model_type;
  qwen3_5_hybrid(r, d, false, s);
  return s;
}

}  // namespace kqlora::impl

namespace kqlora::impl {

DecoderSpec qwen3_5_multimodal_family(HfConfigReader& r, const std::string& model_type) {
  // Qwen3.5 and Qwen3.5-MoE as the hub ships them (Qwen3_5ForConditionalGeneration,
  // Qwen3_5MoeForConditionalGeneration): the text decoder's
  // fields under text_config, its tensors under model.language_model.; the vision tower
  // (vision_config, model.visual.*) and the multi-token prediction head (mtp.*) are not
  // read (docs/MODELS.md, "Gated DeltaNet").
  accept_common_fields(r);
  r.accept({"vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
            "vision_end_token_id"});
  HfConfigReader t = r.object("text_config");
  const std::string text_type = model_type + "_text";  // qwen3_5_text, qwen3_5_moe_text
  const std::string inner = t.string("model_type", text_type, false);
  if (inner != text_type)
    t.fail("model_type", "is " + json::quote(inner) + "; a " + model_type +
                             " directory's text_config is " + json::quote(text_type));
  DecoderSpec s = model_type == "qwen3_5_moe" ? qwen3_5_moe_family(t, model_type)
                                              : qwen3_5_family(t, model_type);
  t.finish();
  // (the head is tied by the top-level field in transformers' multimodal class and by the
  // text config's in Qwen3_5ForCausalLM: the two must agree)
  if (r.has("tie_word_embeddings") && r.boolean("tie_word_embeddings", false) != s.tied)
    r.fail("tie_word_embeddings", "is " + value_text(*r.get("tie_word_embeddings")) +
                                      " but text_config's is " + (s.tied ? "true" : "false") +
                                      ": the two ways to load the model would differ");
  s.file_prefix = "model.language_model.";
  s.skipped = {{"model.visual.", "the vision tower (kqlora trains the text decoder)"},
               {"mtp.", "the multi-token prediction head (not trained)"}};
  s.notes.push_back(
      "a multimodal qwen3_5 directory: the text decoder (text_config, "
      "model.language_model.*) is read; the vision tower is not");
  return s;
}

}  // namespace kqlora::impl
