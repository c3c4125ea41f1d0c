#include "kqlora/nn/decoder_buffers.hpp"

#include <algorithm>

namespace kqlora {

DecoderBuffers decoder_buffers(const DecoderSpec& s, const ModelConfig& cfg,
                               const std::vector<bool>& targets) {
  const int64_t H = s.hidden, Q = s.q_features(), KV = s.kv_features(), I = s.intermediate;
  const int64_t r = cfg.rank;
  const bool qk_norm = s.norm(NormRole::q) != nullptr;
  const bool attn_out = s.norm(NormRole::attn_out) != nullptr;
  const bool mlp_out = s.norm(NormRole::mlp_out) != nullptr;
  DecoderBuffers b;
  b.block = {{"x", H},
             {"n1", H},
             {"q", Q},
             {"k", KV},
             {"v", KV},
             {"q_raw", qk_norm ? Q : 0},
             {"k_raw", qk_norm ? KV : 0},
             {"inv_q", qk_norm ? s.heads : 0, false},
             {"inv_k", qk_norm ? s.kv_heads : 0, false},
             {"att", Q},
             {"lse", s.heads, false},
             {"o_raw", attn_out ? H : 0},
             {"inv_o", attn_out ? 1 : 0, false},
             {"mid", H},
             {"n2", H},
             {"gate", I},
             {"up", I},
             {"act", I},
             {"d_raw", mlp_out ? H : 0},
             {"inv_d", mlp_out ? 1 : 0, false},
             {"inv1", 1, false},
             {"inv2", 1, false}};
  int64_t widest_in = 0, widest_fused = 0;
  for (size_t p = 0; p < s.projections.size(); ++p) {
    const ProjectionSpec& proj = s.projections[p];
    const bool on = p < targets.size() && targets[p];
    b.block.push_back({"h", on ? r : 0});
    b.block.push_back({"xd", on && cfg.dropout > 0 ? s.in_features(proj) : 0});
    widest_in = std::max(widest_in, s.in_features(proj));
    if (proj.slots.size() > 1) widest_fused = std::max(widest_fused, s.out_features(proj));
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
      {"tmp", cfg.bf16() || cfg.dropout > 0 ? std::max({H, Q, I, widest_in, widest_fused}) : 0}};
  return b;
}

}  // namespace kqlora
