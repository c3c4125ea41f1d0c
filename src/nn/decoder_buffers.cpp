#include "kqlora/nn/decoder_buffers.hpp"

#include <algorithm>
#include <array>

#include "kqlora/nn/lora_targets.hpp"

namespace kqlora {

DecoderBuffers decoder_buffers(const DecoderSpec& s, const ModelConfig& cfg,
                               const std::vector<bool>& targets) {
  const std::array<bool, 2> expert_targets = expert_lora_targets(cfg.lora_targets, s);
  // (the dense MLP's buffers only where a layer has one; the experts' where a layer has them)
  // (the widest layer's: Gemma 4's full-attention layers have heads of their own size)
  const int64_t H = s.hidden, Q = s.widest_q(), KV = s.widest_kv();
  const int64_t I = s.widest_mlp();  // (a layer's dense MLP or shared expert; 0: none)
  const bool sparse = s.any_sparse_mlp();
  const int64_t E = sparse ? s.experts.experts : 0, K = sparse ? s.experts.top_k : 0;
  const int64_t KI = K * s.experts.intermediate, KH = K * H;
  const int64_t r = cfg.rank;
  bool shared = false;  // (a layer with a shared expert)
  for (int64_t l = 0; l < s.layers; ++l) shared = shared || s.dense_beside_experts(l);
  const bool beside = sparse && s.experts.beside;  // (Gemma 4's MoE block)
  const bool qk_norm = s.norm(NormRole::q) != nullptr, v_norm = s.norm(NormRole::v) != nullptr;
  // (a norm's 1/rms per (token, head) or per token: its most over the layers)
  const auto norms_per_token = [&](NormRole role, bool q) {
    int64_t n = 0;
    if (const NormSpec* spec = s.norm(role))
      for (int64_t l = 0; l < s.layers; ++l)
        n = std::max(n, (q ? s.q_features(l) : s.kv_features(l)) / s.norm_width(*spec, l));
    return n;
  };
  const bool attn_out = s.norm(NormRole::attn_out) != nullptr;
  const bool mlp_out = s.norm(NormRole::mlp_out) != nullptr;
  const bool gated = s.attn_output_gate, lin = s.any_mixer(Mixer::linear);
  const LinearAttentionSpec& L = s.linear;
  const int64_t P = s.ple_width;  // (Gemma 4's per-layer input width; 0: none)
  int64_t shared_kv = 0;          // (Gemma 4's producers' keys and values, per token)
  for (int64_t l = 0; l < s.layers; ++l)
    if (s.kv_producer(l)) shared_kv += 2 * s.kv_features(l);
  DecoderBuffers b;
  b.block = {{"x", H, true},
             {"n1", s.norm(NormRole::attn_in) ? H : 0, true},
             {"q", Q, true},
             {"k", KV, true},
             {"v", KV, true},
             {"q_raw", qk_norm ? Q : 0, true},
             {"k_raw", qk_norm ? KV : 0, true},
             {"v_raw", s.clip_qkv > 0 || v_norm ? KV : 0, true},
             {"inv_q", norms_per_token(NormRole::q, true)},
             {"inv_k", norms_per_token(NormRole::k, false)},
             {"att", Q, true},
             {"lse", s.heads},
             {"o_raw", attn_out ? H : 0, true},
             {"inv_o", attn_out ? 1 : 0},
             {"mid", H, true},
             {"n2", s.norm(NormRole::mlp_in) ? H : 0, true},
             {"gate", I, true},
             {"up", I, true},
             {"act", I, true},
             {"d_raw", mlp_out ? H : 0, true},
             {"inv_d", mlp_out ? 1 : 0},
             {"inv1", 1},
             {"inv2", 1},
             {"router_logits", E, true},
             {"routing_weight", K},
             {"chosen", K},
             {"where", K},
             {"order", K},
             {"xg", KH, true},
             {"gate_g", KI, true},
             {"up_g", KI, true},
             {"act_g", KI, true},
             {"yg", KH, true},
             {"h_gate_up", expert_targets[0] ? K * r : 0, true},
             {"h_down", expert_targets[1] ? K * r : 0, true},
             {"shared", shared ? H : 0, true},
             {"shared_gate", shared ? 1 : 0},
             {"q_full", gated ? 2 * Q : 0, true},
             {"attn_gate", gated ? Q : 0, true},
             {"att_gated", gated ? Q : 0, true},
             {"lin_mixed", lin ? L.conv_width() : 0, true},
             {"lin_z", lin ? L.value_width() : 0, true},
             {"lin_b", lin ? L.value_heads : 0, true},
             {"lin_a", lin ? L.value_heads : 0, true},
             {"lin_conv", lin ? L.conv_width() : 0, true},
             {"lin_q", lin ? L.key_width() : 0},  // (float32 values: normalised in float32)
             {"lin_k", lin ? L.key_width() : 0},
             {"lin_v", lin ? L.value_width() : 0, true},
             {"lin_beta", lin ? L.value_heads : 0, true},
             {"lin_g", lin ? L.value_heads : 0},
             {"lin_core", lin ? L.value_width() : 0, true},
             {"lin_inv_q", lin ? L.key_heads : 0},
             {"lin_inv_k", lin ? L.key_heads : 0},
             {"lin_inv_norm", lin ? L.value_heads : 0},
             {"lin_out", lin ? L.value_width() : 0, true},
             {"inv_v", norms_per_token(NormRole::v, false)},
             {"ple_in", P > 0 ? H : 0, true},
             {"ple_gate", P, true},
             {"ple_act", P, true},
             {"ple_raw", P > 0 ? H : 0, true},
             {"inv_ple", P > 0 ? 1 : 0},
             {"router_in", beside ? H : 0, true},
             {"inv_router", beside ? 1 : 0},
             {"n3", beside ? H : 0, true},
             {"inv3", beside ? 1 : 0},
             {"experts_raw", beside ? H : 0, true},
             {"inv_e1", beside ? 1 : 0},
             {"inv_e2", beside ? 1 : 0}};
  int64_t widest_in = 0, widest_fused = 0, widest_out = 0;
  for (size_t p = 0; p < s.projections.size(); ++p) {
    const ProjectionSpec& proj = s.projections[p];
    // (a projection no layer has, the dense MLP's of an all-sparse model: none; else its
    // widest over the layers, a shared expert's width differing)
    bool some = false;
    int64_t in = 0, out = 0;
    for (int64_t l = 0; l < s.layers; ++l)
      if (s.has_projection(l, proj)) {
        some = true;
        in = std::max(in, s.in_features(proj, l));
        out = std::max(out, s.out_features(proj, l));
      }
    const bool on = some && p < targets.size() && targets[p];
    b.block.push_back({"h", on ? r : 0, true});
    b.block.push_back({"xd", on && cfg.dropout > 0 ? in : 0, true});
    widest_in = std::max(widest_in, in);
    widest_out = std::max(widest_out, out);
    if (proj.slots.size() > 1) widest_fused = std::max(widest_fused, out);
  }
  b.shared = {
      {"x_out", H},
      {"nf", H},
      {"invf", 1},
      {"g", H},
      {"gtmp", H},
      {"gn", H},
      {"gatt", Q},
      {"gq", Q},
      {"gk", KV},
      {"gv", KV},
      {"gact", I},
      {"ggate", I},
      {"gup", I},
      {"proj_out", H},
      {"fused", widest_fused},
      {"gfused", widest_fused},
      {"gh", r},
      // (read by the LoRA products in bfloat16 or with dropout only)
      {"tmp", cfg.bf16() || cfg.dropout > 0
                  ? std::max({H, Q, I, widest_in, widest_out, widest_fused, s.experts.intermediate})
                  : 0},
      {"gyg", KH},
      {"gxg", KH},
      {"gact_g", KI},
      {"ggate_g", KI},
      {"gup_g", KI},
      {"gw", K},
      {"glogits", E},
      {"g_shared", shared ? H : 0},
      {"gq_full", gated ? 2 * Q : 0},
      {"ggate_a", gated ? Q : 0},
      {"g_lin_out", lin ? L.value_width() : 0},
      {"g_lin_core", lin ? L.value_width() : 0},
      {"g_lin_qv", lin ? L.value_heads * L.key_dim : 0},
      {"g_lin_kv", lin ? L.value_heads * L.key_dim : 0},
      {"g_lin_q", lin ? L.key_width() : 0},
      {"g_lin_k", lin ? L.key_width() : 0},
      {"g_lin_v", lin ? L.value_width() : 0},
      {"g_lin_beta", lin ? L.value_heads : 0},
      {"g_lin_g", lin ? L.value_heads : 0},
      {"g_lin_conv", lin ? L.conv_width() : 0},
      {"g_lin_mixed", lin ? L.conv_width() : 0},
      {"g_lin_z", lin ? L.value_width() : 0},
      {"g_lin_b", lin ? L.value_heads : 0},
      {"g_lin_a", lin ? L.value_heads : 0},
      {"shared_kv", shared_kv},
      {"g_shared_kv", shared_kv},
      {"ple", P * s.layers},
      {"ple_proj", P * s.layers},
      {"inv_ple_proj", P > 0 ? s.layers : 0},
      {"g_ple_act", P},
      {"moe_tmp", beside ? H : 0},
      {"g_n3", beside ? H : 0},
      {"g_router_in", beside ? H : 0}};
  return b;
}

}  // namespace kqlora
