// Gemma 4's text decoder (Gemma4ForCausalLM, model_type gemma4_text): Gemma's sandwich
// norms, but w * n in float32 (not Gemma 2/3's 1 + w), per-head q and k norms of that kind
// and a v norm without a weight; attention scaled by 1; sliding-window layers and
// full-attention layers with a head size and key/value heads of their own (the hub's
// global_head_dim / num_global_key_value_heads, transformers 5.25's per_layer_config),
// whose v is k_proj's raw output when attention_k_eq_v; "proportional" rope on the full
// layers (the rotated frequencies spread over the whole head, the rest zero); each layer's
// output times its frozen layer_scalar; embeddings times sqrt(hidden); a final soft-cap;
// key/value sharing (the last num_kv_shared_layers layers attend over an earlier layer's
// keys and values, their MLP double-wide when use_double_wide_mlp); the per-layer inputs
// (hidden_size_per_layer_input > 0: E2B, E4B); the MoE block (enable_moe_block: 26B-A4B)
// (docs/MODELS.md, "Gemma 4").
#include <cmath>
#include <string>

#include "families.hpp"
#include "family_common.hpp"
#include "kqlora/core/json.hpp"

namespace kqlora::impl {

namespace {

// One layer type's rope: "default" (over the type's head size) or "proportional" (the
// first partial_rotary_factor * head_dim / 2 frequencies base^(-2i / head_dim), the rest
// 0: those pairs pass unrotated), each divided by `factor`.
RopeSpec gemma4_rope(HfConfigReader& p, double theta_default, int64_t head_dim) {
  RopeSpec r;
  r.type = p.string("rope_type", "default", false);
  r.theta = p.number("rope_theta", theta_default, false);
  if (!(r.theta > 0)) p.fail("rope_theta", "must be > 0, got " + value_text(*p.get("rope_theta")));
  r.rotary_dim = head_dim;
  const int64_t pairs = head_dim / 2;
  // (in float32, as transformers computes them)
  const float base = static_cast<float>(r.theta), dim = static_cast<float>(head_dim);
  const auto frequency = [&](int64_t i) {
    return 1.0f / std::pow(base, static_cast<float>(2 * i) / dim);
  };
  if (r.type == "default") {
    for (int64_t i = 0; i < pairs; ++i) r.inv_freq.push_back(frequency(i));
    return r;
  }
  if (r.type != "proportional")
    p.fail("rope_type",
           "is " + json::quote(r.type) + "; Gemma 4's layers take \"default\" or \"proportional\"");
  const double partial = p.number("partial_rotary_factor", 1.0, false);
  if (!(partial > 0 && partial <= 1))
    p.fail("partial_rotary_factor",
           "must be in (0, 1], got " + value_text(*p.get("partial_rotary_factor")));
  const double factor = p.number("factor", 1.0, false);
  if (!(factor > 0)) p.fail("factor", "must be > 0, got " + value_text(*p.get("factor")));
  // (as transformers: int(partial * head_dim // 2) rotated, the exponents over the whole
  // head, then every frequency divided by the factor)
  const auto rotated = static_cast<int64_t>(partial * static_cast<double>(head_dim) / 2.0);
  for (int64_t i = 0; i < pairs; ++i)
    r.inv_freq.push_back((i < rotated ? frequency(i) : 0.0f) / static_cast<float>(factor));
  return r;
}

// config.json's dtype (or torch_dtype) is bfloat16: the weights' values are bfloat16 ones.
bool bfloat16_dtype(HfConfigReader& r) {
  for (const char* key : {"dtype", "torch_dtype"})
    if (r.string(key, "", false) == "bfloat16") return true;
  return false;
}

}  // namespace

DecoderSpec gemma4_family(HfConfigReader& r, const std::string& model_type) {
  // Gemma4TextConfig's defaults (transformers 5.25).
  const FamilyDefaults d{262144, 2304, 9216, 30, 8, 4, 256, 131072, 1e-6, 10000.0, true};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  r.accept({"hidden_act"});  // (Gemma's MLP reads hidden_activation)
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_activation", "gelu_pytorch_tanh", true);
  const bool bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(bias, bias, false);
  const NormKind w = NormKind::float32;
  s.norms = {{"input_layernorm", NormRole::attn_in, w},
             {"post_attention_layernorm", NormRole::attn_out, w},
             {"pre_feedforward_layernorm", NormRole::mlp_in, w},
             {"post_feedforward_layernorm", NormRole::mlp_out, w},
             {"model.norm", NormRole::final, w},
             {"self_attn.q_norm", NormRole::q, w},
             {"self_attn.k_norm", NormRole::k, w},
             {"self_attn.v_norm", NormRole::v, NormKind::unit}};
  // (null: causal; "vision": image tokens see each other, which text alone never has: the
  // hub's 31B says so; "all": bidirectional, refused)
  const std::string bidirectional = r.string("use_bidirectional_attention", "", false);
  if (!bidirectional.empty() && bidirectional != "vision")
    r.fail("use_bidirectional_attention",
           "is " + json::quote(bidirectional) +
               "; kqlora trains causal decoders (null: causal; \"vision\": causal on text)");
  if (bidirectional == "vision")
    s.notes.push_back(
        "use_bidirectional_attention \"vision\": causal on text (no image tokens here)");
  // (what kqlora does not read yet: refused, never ignored)
  // Per-layer inputs (hidden_size_per_layer_input P > 0; transformers' default 256): a
  // table of vocab_size_per_layer_input rows of layers x P, the model's projection and norm,
  // and each layer's per_layer_input_gate, per_layer_projection and their norm.
  s.ple_width = r.integer("hidden_size_per_layer_input", 256, false, 0);
  if (s.ple_width > 0) {
    s.ple_vocab = r.integer("vocab_size_per_layer_input", 262144, false);
    // (its rows are looked up by the token ids: each must have one)
    if (s.ple_vocab < s.vocab)
      r.fail("vocab_size_per_layer_input", "is " + std::to_string(s.ple_vocab) +
                                               ", below vocab_size " + std::to_string(s.vocab) +
                                               ": a token id would have no per-layer row");
    using PI = ProjectionInput;
    s.projections.push_back(
        {"per_layer_input_gate", "per_layer_input_gate", PI::block_out, {Slot::ple_gate}});
    s.projections.push_back(
        {"per_layer_projection", "per_layer_projection", PI::ple_act, {Slot::ple_out}});
    s.norms.push_back({"post_per_layer_input_norm", NormRole::ple_out, w});
    s.norms.push_back({"model.per_layer_projection_norm", NormRole::ple_proj, w});
  }
  r.accept({"vocab_size_per_layer_input"});  // (without per-layer inputs: unused)
  s.ple_table_bf16 = s.ple_width > 0 && bfloat16_dtype(r);
  // The MoE block (26B-A4B): every layer's dense MLP beside num_experts experts of
  // moe_intermediate_size, the top top_k_experts of a softmax renormalised, each times its
  // per_expert_scale; the router reading unitnorm(x) * router.scale * hidden^-1/2.
  if (r.boolean("enable_moe_block", false)) {
    ExpertsSpec& e = s.experts;
    e.experts = r.integer("num_experts", 0, true);
    e.top_k = r.integer("top_k_experts", 0, true);
    if (e.top_k > e.experts || e.top_k > kMaxTopK)
      r.fail("top_k_experts", "is " + std::to_string(e.top_k) + ": at most num_experts " +
                                  std::to_string(e.experts) + " and " + std::to_string(kMaxTopK));
    e.intermediate = r.integer("moe_intermediate_size", 0, true);
    e.norm_topk = true;
    e.router = RouterKind::softmax_topk;
    e.router_module = e.fused_router = "router.proj";
    e.experts_module = e.fused_module = "experts";
    e.beside = true;
    e.router_scale = "router.scale";
    e.per_expert_scale = "router.per_expert_scale";
    for (LayerSpec& at : s.layer) at.sparse = true;
    s.norms.push_back({"post_feedforward_layernorm_1", NormRole::dense_out, w});
    s.norms.push_back({"pre_feedforward_layernorm_2", NormRole::experts_in, w});
    s.norms.push_back({"post_feedforward_layernorm_2", NormRole::experts_out, w});
  } else {
    r.accept({"num_experts", "top_k_experts", "moe_intermediate_size"});  // (MoE block's)
  }
  s.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(s.hidden)));
  s.attn_scale = 1.0f;
  if (r.has("final_logit_softcapping")) {
    const double c = r.number("final_logit_softcapping", 0, false);
    if (!(c > 0))
      r.fail("final_logit_softcapping", "must be > 0 or null (no soft-cap), got " +
                                            value_text(*r.get("final_logit_softcapping")));
    s.final_softcap = static_cast<float>(c);
  }
  s.layer_scalar = true;

  // Layer types: sliding_attention / full_attention (default: every sixth full); as
  // transformers, the last layer is full whatever the file says.
  const int64_t window = r.integer("sliding_window", 512, false);
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (int64_t l = 0; l < s.layers; ++l) sliding[static_cast<size_t>(l)] = (l + 1) % 6 != 0;
  read_layer_types(r, window, sliding, s);
  if (s.layer.back().window > 0) {
    s.layer.back().window = 0;
    s.notes.push_back(
        "layer_types: the last layer is full_attention (transformers' Gemma 4 forces it)");
  }

  // The full-attention layers' head size and key/value heads: per_layer_config (what
  // transformers 5.25 saves), else global_head_dim (default 512) and, with
  // attention_k_eq_v, num_global_key_value_heads.
  const bool k_eq_v = r.boolean("attention_k_eq_v", false);
  if (r.has("per_layer_config")) {
    for (const char* key : {"global_head_dim", "num_global_key_value_heads"})
      if (r.has(key))
        r.fail(key, "is set beside per_layer_config, which says the same per layer: keep one");
    // (keys are layer indices; transformers' save_pretrained pads them with zeros to the
    // widest: "04" of 35 layers)
    HfConfigReader p = r.object("per_layer_config");
    for (const auto& [key, value] : r.get("per_layer_config")->object) {
      const bool digits = !key.empty() && key.size() <= 9 &&
                          key.find_first_not_of("0123456789") == std::string::npos;
      const int64_t l = digits ? std::stoll(key) : -1;
      if (l < 0 || l >= s.layers)
        r.fail("per_layer_config", "has the key " + json::quote(key) +
                                       ": not a layer index below " + std::to_string(s.layers));
      HfConfigReader o = p.object(key.c_str());
      LayerSpec& at = s.layer[static_cast<size_t>(l)];
      at.head_dim = o.integer("head_dim", s.head_dim, false);
      at.kv_heads = o.integer("num_key_value_heads", s.kv_heads, false);
      o.finish();
    }
  } else {
    const int64_t global = r.integer("global_head_dim", 512, false);
    const int64_t global_kv = r.integer("num_global_key_value_heads", 0, false, 0);
    for (LayerSpec& at : s.layer) {
      if (at.window > 0) continue;
      at.head_dim = global;
      if (k_eq_v && global_kv > 0) at.kv_heads = global_kv;
    }
  }
  // Key/value sharing: the last num_kv_shared_layers layers attend over the keys and
  // values of the last earlier layer of their type (transformers' kv_sharing_modes), with
  // no k_proj, v_proj or k/v norms of their own; use_double_wide_mlp doubles their MLP.
  const int64_t shared = r.integer("num_kv_shared_layers", 0, false, 0);
  const bool double_wide = r.boolean("use_double_wide_mlp", false);
  if (shared >= s.layers && shared > 0)
    r.fail("num_kv_shared_layers", "is " + std::to_string(shared) + ", not below the " +
                                       std::to_string(s.layers) +
                                       " layers: some layer must compute the keys and values");
  for (int64_t l = s.layers - shared; l < s.layers; ++l) {
    LayerSpec& at = s.layer[static_cast<size_t>(l)];
    for (int64_t p = s.layers - shared - 1; p >= 0 && at.kv_source < 0; --p)
      if ((s.layer[static_cast<size_t>(p)].window > 0) == (at.window > 0)) at.kv_source = p;
    if (at.kv_source < 0)
      r.fail("num_kv_shared_layers",
             "is " + std::to_string(shared) + ": layer " + std::to_string(l) + " is " +
                 (at.window > 0 ? "sliding" : "full") +
                 "-attention, and no earlier unshared layer of its type has keys and values to "
                 "share");
    if (double_wide) at.mlp_width = 2 * s.intermediate;
  }
  const bool per_layer = r.has("per_layer_config");
  for (int64_t l = 0; l < s.layers; ++l) {
    LayerSpec& at = s.layer[static_cast<size_t>(l)];
    at.k_eq_v = k_eq_v && at.window == 0;
    const int64_t hd = s.head_dim_of(l), kv = s.kv_heads_of(l);
    // (the field the layer's sizes came from)
    const bool own = at.head_dim > 0 || at.kv_heads > 0;
    const char* head_field = per_layer ? "per_layer_config" : own ? "global_head_dim" : "head_dim";
    const char* kv_field = per_layer         ? "per_layer_config"
                           : at.kv_heads > 0 ? "num_global_key_value_heads"
                                             : "num_key_value_heads";
    if (hd % 2 != 0)
      r.fail(head_field, "gives layer " + std::to_string(l) + " head_dim " + std::to_string(hd) +
                             ": the rotary needs an even one");
    if (s.heads % kv != 0)
      r.fail(kv_field, "gives layer " + std::to_string(l) + " " + std::to_string(kv) +
                           " key/value heads, not dividing num_attention_heads " +
                           std::to_string(s.heads));
    // (a sharing layer attends over its producer's keys and values: their heads)
    if (at.kv_source >= 0 &&
        (kv != s.kv_heads_of(at.kv_source) || hd != s.head_dim_of(at.kv_source)))
      r.fail(kv_field, "gives layer " + std::to_string(l) + " " + std::to_string(kv) + " x " +
                           std::to_string(hd) +
                           " key/value heads, but the layer whose keys and "
                           "values it shares (" +
                           std::to_string(at.kv_source) + ") has " +
                           std::to_string(s.kv_heads_of(at.kv_source)) + " x " +
                           std::to_string(s.head_dim_of(at.kv_source)));
  }

  // The ropes, one a layer type (rope_parameters keyed by it), each over the head size of
  // its layers (one per type: a type's layers must agree).
  int64_t type_head[2] = {0, 0};  // full, sliding
  for (int64_t l = 0; l < s.layers; ++l) {
    const int t = s.layer[static_cast<size_t>(l)].window > 0 ? 1 : 0;
    if (type_head[t] != 0 && type_head[t] != s.head_dim_of(l))
      r.fail("per_layer_config", "gives " + std::string(t ? "sliding" : "full") +
                                     "-attention layers different head sizes; Gemma 4's rope is "
                                     "one a layer type");
    type_head[t] = s.head_dim_of(l);
    s.layer[static_cast<size_t>(l)].rope = t;
  }
  const char* types[2] = {"full_attention", "sliding_attention"};
  const auto default_rope = [&](int t, int64_t hd) {
    // (transformers' defaults: proportional 0.25 at 1e6 on full layers, default 1e4 sliding)
    const json::Value v = json::parse(t == 0 ? "{\"rope_type\": \"proportional\", "
                                               "\"partial_rotary_factor\": 0.25, "
                                               "\"rope_theta\": 1e6}"
                                             : "{\"rope_type\": \"default\", \"rope_theta\": 1e4}",
                                      "Gemma 4's default rope");
    HfConfigReader p(v, r.source());
    return gemma4_rope(p, 0, hd);
  };
  const char* name = nullptr;
  if (rope_object(r, &name)) {
    HfConfigReader top = r.object(name);
    for (int t = 0; t < 2; ++t) {
      const int64_t hd = type_head[t] > 0 ? type_head[t] : s.head_dim;
      if (!top.has(types[t])) {
        s.ropes.push_back(default_rope(t, hd));
        continue;
      }
      HfConfigReader p = top.object(types[t]);
      s.ropes.push_back(gemma4_rope(p, t == 0 ? 1000000.0 : 10000.0, hd));
      p.finish();
    }
    top.finish();
  } else {
    for (int t = 0; t < 2; ++t)
      s.ropes.push_back(default_rope(t, type_head[t] > 0 ? type_head[t] : s.head_dim));
  }
  return s;
}

DecoderSpec gemma4_multimodal_family(HfConfigReader& r, const std::string& model_type) {
  // Gemma 4 as the hub ships it (Gemma4ForConditionalGeneration): the text decoder's
  // fields under text_config, its tensors under model.language_model.; the vision and
  // audio towers and their embedders are not read. AutoModelForCausalLM builds the
  // multimodal model from such a directory: the exports name modules as it does.
  accept_common_fields(r);
  r.accept({"vision_config", "audio_config", "boi_token_id", "eoi_token_id", "image_token_id",
            "video_token_id", "boa_token_id", "eoa_token_id", "eoa_token_index", "audio_token_id",
            "vision_soft_tokens_per_image", "initializer_range"});
  HfConfigReader t = r.object("text_config");
  const std::string inner = t.string("model_type", "gemma4_text", false);
  if (inner != "gemma4_text")
    t.fail("model_type",
           "is " + json::quote(inner) + "; a gemma4 directory's text_config is \"gemma4_text\"");
  DecoderSpec s = gemma4_family(t, model_type);
  t.finish();
  s.ple_table_bf16 = s.ple_table_bf16 || (s.ple_width > 0 && bfloat16_dtype(r));
  if (r.has("tie_word_embeddings") && r.boolean("tie_word_embeddings", true) != s.tied)
    r.fail("tie_word_embeddings", "is " + value_text(*r.get("tie_word_embeddings")) +
                                      " but text_config's is " + (s.tied ? "true" : "false") +
                                      ": the two ways to load the model would differ");
  s.file_prefix = "model.language_model.";
  s.loaded_prefix = "model.language_model.";
  const std::string towers = " (kqlora trains the text decoder)";
  s.skipped = {{"model.vision_tower.", "the vision tower" + towers},
               {"model.embed_vision.", "the vision embedder" + towers},
               {"model.audio_tower.", "the audio tower" + towers},
               {"model.embed_audio.", "the audio embedder" + towers}};
  s.notes.push_back(
      "a multimodal gemma4 directory: the text decoder (text_config, model.language_model.*) "
      "is read; the vision and audio towers are not");
  return s;
}

}  // namespace kqlora::impl
