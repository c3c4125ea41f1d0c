#pragma once
// What the family files share: a family's config-class defaults, the dimensions, the
// Llama-shaped projections and norms, rotary tables, per-layer attention types.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hf_config_reader.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::impl {

/// A family's config-class defaults for the fields read by read_dims (0: derived:
/// kv_heads = heads, head_dim = hidden / heads).
struct FamilyDefaults {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_positions;
  double norm_eps, rope_theta;
  bool tied;
};

/// Qwen3's attention (Qwen3 and Qwen3-MoE): `attention_bias` on q, k, v and o, per-head
/// q/k norms of Llama's kind, 1/sqrt(head_dim) scores, the rope (default, linear, llama3).
void qwen3_attention(HfConfigReader& r, const FamilyDefaults& d, DecoderSpec& s);

/// Qwen2's attention (Qwen2 and Qwen2-MoE): biases on q, k, v when `qkv_bias` (none on o),
/// no q/k norms, 1/sqrt(head_dim) scores, the rope (default, linear, llama3).
void qwen2_attention(HfConfigReader& r, const FamilyDefaults& d, bool qkv_bias, DecoderSpec& s);

/// The dimensions, eps, tie flag; absent fields take `d` with a note.
void read_dims(HfConfigReader& r, const FamilyDefaults& d, DecoderSpec& s);

/// q, k, v, o, gate, up, down (Llama's modules), with biases on q/k/v, on o, on the MLP.
std::vector<ProjectionSpec> llama_projections(bool qkv_bias, bool o_bias, bool mlp_bias);

/// input_layernorm (attention input) and post_attention_layernorm (MLP input) of a kind,
/// and the final model.norm.
std::vector<NormSpec> pre_norms(NormKind kind);

/// A rotary table from the rope fields of `params` (rope_parameters / rope_scaling or
/// Gemma 3's per-layer-type object; null: the default rope), base `theta` and
/// partial_rotary_factor `partial` (none: the family has no partial rotary, and a factor
/// other than 1 in the object is refused): types default, linear, llama3, longrope
/// (`allowed` limits them per family). `max_positions` and `original_max` (a top-level
/// value, which wins over the object's; 0: none) serve longrope. Errors without a rope
/// object name `top`'s file.
RopeSpec read_rope(HfConfigReader& top, HfConfigReader* params, double theta, int64_t head_dim,
                   std::optional<double> partial, int64_t max_positions, int64_t original_max,
                   const std::vector<std::string>& allowed);

/// The rope object of a top-level config: rope_parameters (transformers 5) or rope_scaling
/// (older files). Returns whether one exists.
bool rope_object(HfConfigReader& r, const char** name);

/// read_rope over the config's rope object when it has one (its fields checked), else
/// the default rope of `theta`.
RopeSpec read_config_rope(HfConfigReader& r, double theta, int64_t head_dim,
                          std::optional<double> partial, int64_t max_positions,
                          int64_t original_max, const std::vector<std::string>& allowed);

/// Per-layer windows from `layer_types` ("full_attention" | "sliding_attention"; empty:
/// `sliding` gives each layer's default). `window` is used on the sliding ones;
/// `window_off` (when set) says why there is none, for a layer typed sliding anyway.
void read_layer_types(HfConfigReader& r, int64_t window, const std::vector<bool>& sliding,
                      DecoderSpec& s, const char* window_off = nullptr);

/// The experts' count and a router's common fields into `e`: num_experts or its alias
/// num_local_experts (either spelling, both only when equal; at least 1),
/// num_experts_per_tok (at least 1, at most the experts and kMaxTopK),
/// output_router_logits and router_aux_loss_coef (>= 0), absent fields taking the config
/// class's defaults.
void read_router(HfConfigReader& r, int64_t experts_default, int64_t top_k_default,
                 double coef_default, ExpertsSpec& e);

/// The experts' sizes bounded as read_dims bounds the dense ones: an expert's projection,
/// the router, the experts' table rows, a shared expert's projection each within this
/// node's memory, else the field is named (called for every family after its reader).
void bound_expert_sizes(HfConfigReader& r, const DecoderSpec& s);

/// A Gated DeltaNet layer's sizes bounded by this node's memory (in_proj_qkv, the states,
/// the conv), naming the field.
void bound_linear_sizes(HfConfigReader& r, const LinearAttentionSpec& L, int64_t hidden);

/// Qwen3.5's hybrid decoder (qwen3_5.cpp), shared by Qwen3.5-MoE and Qwen3-Next: the
/// dims, gated attention, Gated DeltaNet sizes and projections (`fused`: Qwen3-Next's
/// in_proj_qkvz and in_proj_ba, per key head group), zero-centred norms, the rope and
/// layer_types. The MLP is the caller's.
void qwen3_5_hybrid(HfConfigReader& r, const FamilyDefaults& d, bool fused, DecoderSpec& s);

/// Which layers are sparse (Qwen2-MoE's and Qwen3-MoE's rule, as transformers): layer l
/// when (l + 1) % decoder_sparse_step == 0 and mlp_only_layers does not name it.
void read_sparse_layers(HfConfigReader& r, DecoderSpec& s);

/// Refuses a non-zero dropout field (kqlora trains without them, as eval-mode PyTorch
/// computes).
void refuse_dropout(HfConfigReader& r, const char* key);

/// The MLP activation of `key` ("silu", or "gelu_pytorch_tanh" / "gelu_tanh" where `gelu`).
Activation read_activation(HfConfigReader& r, const char* key, const std::string& fallback,
                           bool gelu);

}  // namespace kqlora::impl
