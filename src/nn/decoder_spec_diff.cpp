#include "kqlora/nn/decoder_spec_diff.hpp"

#include <sstream>

namespace kqlora {

namespace {

/// Collects the first difference; later comparisons are skipped once one is found.
class Diff {
 public:
  template <class T>
  void field(const std::string& name, const T& a, const T& b) {
    if (!text_.empty() || a == b) return;
    std::ostringstream s;
    s.precision(17);
    s << name << ": " << a << " vs " << b;
    text_ = s.str();
  }
  void field(const std::string& name, bool a, bool b) {
    field(name, std::string(a ? "true" : "false"), std::string(b ? "true" : "false"));
  }
  template <class E>
  void code(const std::string& name, E a, E b) {
    field(name, static_cast<int>(a), static_cast<int>(b));
  }
  void values(const std::string& name, const std::vector<float>& a, const std::vector<float>& b) {
    field(name + " (count)", a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      field(name + "[" + std::to_string(i) + "]", a[i], b[i]);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

}  // namespace

std::string first_spec_difference(const DecoderSpec& a, const DecoderSpec& b) {
  Diff d;
  d.field("model_type", a.model_type, b.model_type);
  d.field("vocab_size", a.vocab, b.vocab);
  d.field("hidden_size", a.hidden, b.hidden);
  d.field("intermediate_size", a.intermediate, b.intermediate);
  d.field("num_hidden_layers", a.layers, b.layers);
  d.field("num_attention_heads", a.heads, b.heads);
  d.field("num_key_value_heads", a.kv_heads, b.kv_heads);
  d.field("head_dim", a.head_dim, b.head_dim);
  d.field("max_position_embeddings", a.max_positions, b.max_positions);
  d.field("rms_norm_eps", a.norm_eps, b.norm_eps);
  d.field("tie_word_embeddings", a.tied, b.tied);
  d.code("activation", a.mlp_activation, b.mlp_activation);
  d.field("embedding scale", a.embed_scale, b.embed_scale);
  d.field("attention scale", a.attn_scale, b.attn_scale);
  d.field("attention soft-cap", a.attn_softcap, b.attn_softcap);
  d.field("final soft-cap", a.final_softcap, b.final_softcap);
  d.field("embedding_multiplier", a.embed_multiplier, b.embed_multiplier);
  d.field("residual_multiplier", a.residual_multiplier, b.residual_multiplier);
  d.field("logits_scaling", a.logits_divisor, b.logits_divisor);
  d.field("clip_qkv", a.clip_qkv, b.clip_qkv);
  d.field("attention sinks", a.sinks, b.sinks);
  d.field("attn_output_gate", a.attn_output_gate, b.attn_output_gate);
  d.field("layer_scalar", a.layer_scalar, b.layer_scalar);
  d.field("hidden_size_per_layer_input", a.ple_width, b.ple_width);
  d.field("vocab_size_per_layer_input", a.ple_vocab, b.ple_vocab);
  d.field("dtype (the per-layer table's)", a.ple_table_bf16, b.ple_table_bf16);
  const LinearAttentionSpec &la = a.linear, &lb = b.linear;
  d.field("linear_num_key_heads", la.key_heads, lb.key_heads);
  d.field("linear_num_value_heads", la.value_heads, lb.value_heads);
  d.field("linear_key_head_dim", la.key_dim, lb.key_dim);
  d.field("linear_value_head_dim", la.value_dim, lb.value_dim);
  d.field("linear_conv_kernel_dim", la.kernel, lb.kernel);
  d.field("projections (count)", a.projections.size(), b.projections.size());
  for (size_t i = 0; i < a.projections.size() && i < b.projections.size(); ++i) {
    const ProjectionSpec &p = a.projections[i], &q = b.projections[i];
    const std::string at = "projection " + p.module;
    d.field(at + " (module)", p.module, q.module);
    d.field(at + " (LoRA name)", p.name, q.name);
    d.code(at + " (input)", p.input, q.input);
    d.field(at + " (slots)", p.slots.size(), q.slots.size());
    for (size_t k = 0; k < p.slots.size() && k < q.slots.size(); ++k)
      d.code(at + " (slot " + std::to_string(k) + ")", p.slots[k], q.slots[k]);
    d.field(at + " (bias)", p.bias, q.bias);
    d.field(at + " (column groups)", p.groups, q.groups);
  }
  d.field("norms (count)", a.norms.size(), b.norms.size());
  for (size_t i = 0; i < a.norms.size() && i < b.norms.size(); ++i) {
    const NormSpec &n = a.norms[i], &m = b.norms[i];
    d.field("norm " + n.module + " (module)", n.module, m.module);
    d.code("norm " + n.module + " (role)", n.role, m.role);
    d.code("norm " + n.module + " (kind)", n.kind, m.kind);
    d.field("norm " + n.module + " (whole projection)", n.whole, m.whole);
  }
  d.field("ropes (count)", a.ropes.size(), b.ropes.size());
  for (size_t i = 0; i < a.ropes.size() && i < b.ropes.size(); ++i) {
    const RopeSpec &r = a.ropes[i], &s = b.ropes[i];
    const std::string at = "rope " + std::to_string(i);
    d.field(at + " rope_theta", r.theta, s.theta);
    d.field(at + " rope_type", r.type, s.type);
    d.field(at + " rotary dimension", r.rotary_dim, s.rotary_dim);
    d.field(at + " attention factor", r.attention_factor, s.attention_factor);
    d.field(at + " long above", r.long_above, s.long_above);
    d.values(at + " inverse frequency", r.inv_freq, s.inv_freq);
    d.values(at + " long inverse frequency", r.inv_freq_long, s.inv_freq_long);
  }
  for (size_t l = 0; l < a.layer.size() && l < b.layer.size(); ++l) {
    d.field("layer " + std::to_string(l) + " sliding window", a.layer[l].window, b.layer[l].window);
    d.field("layer " + std::to_string(l) + " rope", a.layer[l].rope, b.layer[l].rope);
    d.field("layer " + std::to_string(l) + " sparse", a.layer[l].sparse, b.layer[l].sparse);
    d.field("layer " + std::to_string(l) + " rotary", a.layer[l].rotary, b.layer[l].rotary);
    d.code("layer " + std::to_string(l) + " mixer", a.layer[l].mixer, b.layer[l].mixer);
    d.field("layer " + std::to_string(l) + " head_dim", a.head_dim_of(l), b.head_dim_of(l));
    d.field("layer " + std::to_string(l) + " key/value heads", a.kv_heads_of(l), b.kv_heads_of(l));
    d.field("layer " + std::to_string(l) + " attention_k_eq_v", a.layer[l].k_eq_v,
            b.layer[l].k_eq_v);
    d.field("layer " + std::to_string(l) + " keys and values of layer", a.layer[l].kv_source,
            b.layer[l].kv_source);
    d.field("layer " + std::to_string(l) + " MLP width", a.mlp_width(l), b.mlp_width(l));
  }
  const ExpertsSpec &x = a.experts, &y = b.experts;
  d.field("num_experts", x.experts, y.experts);
  d.field("num_experts_per_tok", x.top_k, y.top_k);
  d.field("moe_intermediate_size", x.intermediate, y.intermediate);
  d.field("norm_topk_prob", x.norm_topk, y.norm_topk);
  d.code("router", x.router, y.router);
  d.field("router module", x.router_module, y.router_module);
  d.field("experts module", x.experts_module, y.experts_module);
  d.field("expert gate name", x.gate_name, y.gate_name);
  d.field("expert up name", x.up_name, y.up_name);
  d.field("expert down name", x.down_name, y.down_name);
  d.field("fused experts module", x.fused_module, y.fused_module);
  d.field("fused router module", x.fused_router, y.fused_router);
  d.field("output_router_logits", x.aux_loss, y.aux_loss);
  d.field("router_aux_loss_coef", x.aux_loss_coef, y.aux_loss_coef);
  d.field("shared_expert_intermediate_size", x.shared_intermediate, y.shared_intermediate);
  d.field("shared expert module", x.shared_module, y.shared_module);
  d.field("shared expert gate module", x.shared_gate_module, y.shared_gate_module);
  d.field("router bias", x.router_bias, y.router_bias);
  d.field("expert biases", x.expert_bias, y.expert_bias);
  d.field("swiglu_alpha", x.swiglu_alpha, y.swiglu_alpha);
  d.field("swiglu_limit", x.swiglu_limit, y.swiglu_limit);
  d.code("experts layout", x.layout, y.layout);
  d.field("experts beside the dense MLP", x.beside, y.beside);
  d.field("router input scale", x.router_scale, y.router_scale);
  d.field("per-expert scale", x.per_expert_scale, y.per_expert_scale);
  return d.text();
}

}  // namespace kqlora
