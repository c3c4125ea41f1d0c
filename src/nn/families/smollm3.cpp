// SmolLM3 (SmolLM3ForCausalLM): Llama's blocks, GQA and a tied head, with the rotary left
// out of the layers whose `no_rope_layers` entry is 0 (1: the layer rotates q and k; by
// default every no_rope_layer_interval-th layer has none), and sliding windows on the
// layers `layer_types` names when use_sliding_window is set.
#include <cmath>

#include "families.hpp"
#include "family_common.hpp"

namespace kqlora::impl {

DecoderSpec smollm3_family(HfConfigReader& r, const std::string& model_type) {
  // SmolLM3Config's defaults (transformers 5; its default rope base is 2e6).
  const FamilyDefaults d{128256, 2048, 11008, 36, 16, 4, 0, 32768, 1e-6, 2000000.0, true};
  DecoderSpec s;
  s.model_type = model_type;
  accept_common_fields(r);
  read_dims(r, d, s);
  refuse_dropout(r, "attention_dropout");
  s.mlp_activation = read_activation(r, "hidden_act", "silu", false);
  const bool attention_bias = r.boolean("attention_bias", false);
  s.projections = llama_projections(attention_bias, attention_bias, r.boolean("mlp_bias", false));
  s.norms = pre_norms(NormKind::scale);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const double theta = r.number("rope_theta", d.rope_theta, false);
  s.ropes.push_back(read_config_rope(r, theta, s.head_dim, std::nullopt, s.max_positions, 0,
                                     {"linear", "llama3", "yarn"}));

  // no_rope_layers: one 0/1 entry per layer (absent: 0 on every interval-th layer).
  const int64_t interval = r.integer("no_rope_layer_interval", 4, false, 1);
  const std::vector<double> rope_on = r.numbers("no_rope_layers");
  if (r.has("no_rope_layers") && static_cast<int64_t>(rope_on.size()) != s.layers)
    r.fail("no_rope_layers", "has " + std::to_string(rope_on.size()) + " entries for " +
                                 std::to_string(s.layers) + " layers");
  for (int64_t l = 0; l < s.layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (rope_on.empty()) {
      s.layer[i].rotary = (l + 1) % interval != 0;
      continue;
    }
    if (rope_on[i] != 0 && rope_on[i] != 1)
      r.fail("no_rope_layers", "entry " + std::to_string(l) + " is " +
                                   value_text(r.get("no_rope_layers")->array[i]) +
                                   "; each is 1 (the layer uses rope) or 0 (it does not)");
    s.layer[i].rotary = rope_on[i] == 1;
  }
  // Windows: transformers gives a layer sliding_window when use_sliding_window is set and
  // its layer_types entry is sliding (by default: the layers without rope, given a window).
  const bool use_window = r.boolean("use_sliding_window", false);
  const int64_t window = r.present("sliding_window") ? r.integer("sliding_window", 0, false) : 0;
  std::vector<bool> sliding(static_cast<size_t>(s.layers));
  for (int64_t l = 0; l < s.layers; ++l)
    sliding[static_cast<size_t>(l)] = use_window && window > 0 && !s.layer[l].rotary;
  read_layer_types(r, use_window ? window : 0, sliding, s,
                   use_window ? nullptr : "use_sliding_window is false");
  return s;
}

}  // namespace kqlora::impl
