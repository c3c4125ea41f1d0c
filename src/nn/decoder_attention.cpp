// The attention sublayer of a decoder block: q, k, v projections, their q/k norms (per
// head or whole) and clamp, the rotary, the causal attention with its window, soft-cap and
// documents, and the o projection; forward and backward (docs/MODELS.md).
#include <tuple>

#include "decoder_names.hpp"
#include "kqlora/nn/attention_output_gate.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/clip_values.hpp"
#include "kqlora/nn/residual.hpp"

namespace kqlora {

namespace {

using B = DecoderBuffers;
using decoder::flat;
using decoder::per_head;

}  // namespace

template <class ExecSpace>
void CausalLm<ExecSpace>::attention_views(int l, Buffers& c) {
  // (views from each buffer's start: its storage is the widest layer's; Gemma 4's
  // full-attention layers have heads of their own size)
  const auto narrow = [&](Matrix<Mem>& m, int64_t width) {
    if (m.data()) m = Matrix<Mem>(m.data(), tokens_, width);
  };
  const int64_t q = spec_.q_features(l), kv = spec_.kv_features(l);
  for (int i : {B::kQ, B::kQRaw, B::kAtt, B::kAttnGate, B::kAttGated}) narrow(c[i], q);
  for (int i : {B::kK, B::kV, B::kKRaw, B::kVRaw}) narrow(c[i], kv);
  narrow(c[B::kQFull], 2 * q);
  for (int i : {B::kGAtt, B::kGQ, B::kGGateA}) narrow(buf_[i], q);
  for (int i : {B::kGK, B::kGV}) narrow(buf_[i], kv);
  narrow(buf_[B::kGQFull], 2 * q);
  // (per-head statistics: one a (token, head); a whole-projection norm's one a token)
  for (const auto& [role, i, width] : {std::make_tuple(NormRole::q, int(B::kInvQ), q),
                                       std::make_tuple(NormRole::k, int(B::kInvK), kv),
                                       std::make_tuple(NormRole::v, int(B::kInvV), kv)})
    if (const NormSpec* n = spec_.norm(role)) narrow(c[i], width / spec_.norm_width(*n, l));
  for (size_t p = 0; p < spec_.projections.size(); ++p)
    if (spec_.projections[p].input == ProjectionInput::attn_out)
      narrow(c[DecoderBuffers::xd(static_cast<int>(p))], q);
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::shared_kv(int producer, bool value, bool gradient) -> Matrix<Mem> {
  // (producer's k then v, [T, kv] blocks in the one buffer: docs/MODELS.md, "Gemma 4")
  const int64_t kv = spec_.kv_features(producer);
  const int64_t at = spec_.kv_shared_offset(producer) + (value ? kv : 0);
  return Matrix<Mem>(buf_[gradient ? B::kGSharedKV : B::kSharedKV].data() + tokens_ * at, tokens_,
                     kv);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::attention_forward(int l, Buffers& c) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t S = seq_len_, D = spec_.head_dim_of(l);
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  // (Gemma 4's key/value sharing: a layer over another's keys and values computes q alone)
  const int64_t source = spec_.layer[l].kv_source;
  attention_views(l, c);
  project_all(l, ProjectionInput::attn_norm, c);
  const bool v_norm = spec_.norm(NormRole::v) != nullptr && source < 0;
  if (spec_.layer[l].k_eq_v && source < 0)  // (v = k_proj's raw output, before k's norm)
    Kokkos::deep_copy(exec, v_norm || spec_.clip_qkv > 0 ? c[B::kVRaw] : c[B::kV],
                      norm_of(NormRole::k) ? c[B::kKRaw] : c[B::kK]);
  if (spec_.attn_output_gate)  // (q before its norm, when it has one)
    split_gated_q(exec, c[B::kQFull], D, norm_of(NormRole::q) ? c[B::kQRaw] : c[B::kQ],
                  c[B::kAttnGate]);
  // q and k norms (per head or whole), before the rotary
  for (NormRole role : {NormRole::q, NormRole::k}) {
    if (!norm_of(role)) continue;
    const bool q = role == NormRole::q;
    const int64_t w = spec_.norm_width(*spec_.norm(role), l);
    norm_forward(norm_of(role), role, per_head(c[q ? B::kQRaw : B::kKRaw], w),
                 per_head(c[q ? B::kQ : B::kK], w), c[q ? B::kInvQ : B::kInvK]);
  }
  if (v_norm)  // (Gemma 4's, per head without a weight: v from its raw copy, kept)
    norm_forward(nullptr, NormRole::v, per_head(c[B::kVRaw], D), per_head(c[B::kV], D),
                 c[B::kInvV]);
  if (spec_.clip_qkv > 0) {  // (v from its raw copy: the backward reads the clamp's input)
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kQ], c[B::kQ]);
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kK], c[B::kK]);
    clip_forward(exec, spec_.clip_qkv, bf16, c[B::kVRaw], c[B::kV]);
  }
  if (spec_.layer[l].rotary) {
    const RopeTable<Mem>& rope = rope_[spec_.layer[l].rope];
    rope_apply(exec, rope, S, D, false, bf16, c[B::kQ], positions_);
    if (source < 0) rope_apply(exec, rope, S, D, false, bf16, c[B::kK], positions_);
  }
  if (spec_.kv_producer(l)) {  // (kept for the layers after it that attend over them)
    Kokkos::deep_copy(exec, shared_kv(l, false, false), c[B::kK]);
    Kokkos::deep_copy(exec, shared_kv(l, true, false), c[B::kV]);
  }
  const int from = static_cast<int>(source);
  causal_attention_forward(exec, attention_shape(l), c[B::kQ],
                           source < 0 ? c[B::kK] : shared_kv(from, false, false),
                           source < 0 ? c[B::kV] : shared_kv(from, true, false), bf16, att_ws_,
                           c[B::kAtt], flat(c[B::kLse]), docs_);
  if (spec_.attn_output_gate)  // att * sigmoid(gate)
    attention_gate_forward(exec, c[B::kAtt], c[B::kAttnGate], bf16, c[B::kAttGated]);
  project_all(l, ProjectionInput::attn_out, c);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::attention_backward(int l, Buffers& c, const Matrix<Mem>& g_o,
                                             bool accumulate, const Matrix<Mem>& gx) {
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const int64_t S = seq_len_, D = spec_.head_dim_of(l);
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  Buffers& s = buf_;
  const int64_t source = spec_.layer[l].kv_source;
  const int from = static_cast<int>(source);
  attention_views(l, c);
  project_back(l, spec_.writer(Slot::o), c, g_o, accumulate, 0.0f, s[B::kGAtt]);
  if (spec_.attn_output_gate)  // y = att s, s = sigmoid(gate): d att = g s, d gate = g att s'
    attention_gate_backward(exec, c[B::kAtt], c[B::kAttnGate], bf16, s[B::kGAtt], s[B::kGGateA]);
  causal_attention_backward(
      exec, attention_shape(l), c[B::kQ], source < 0 ? c[B::kK] : shared_kv(from, false, false),
      source < 0 ? c[B::kV] : shared_kv(from, true, false), c[B::kAtt], flat(c[B::kLse]),
      s[B::kGAtt], bf16, att_ws_, s[B::kGQ], s[B::kGK], s[B::kGV], docs_);
  if (source >= 0) {  // (the keys' and values' gradients go to the layer they are of)
    residual_add(exec, s[B::kGK], bf16, shared_kv(from, false, true));
    residual_add(exec, s[B::kGV], bf16, shared_kv(from, true, true));
  } else if (spec_.kv_producer(l)) {  // (and arrive there: the later layers' first)
    residual_add(exec, shared_kv(l, false, true), bf16, s[B::kGK]);
    residual_add(exec, shared_kv(l, true, true), bf16, s[B::kGV]);
  }
  if (spec_.layer[l].rotary) {
    const RopeTable<Mem>& rope = rope_[spec_.layer[l].rope];
    rope_apply(exec, rope, S, D, true, bf16, s[B::kGQ], positions_);
    if (source < 0) rope_apply(exec, rope, S, D, true, bf16, s[B::kGK], positions_);
  }
  if (spec_.clip_qkv > 0) clip_qkv_backward(l, c);
  // (in place: the norm's backward reads a row, then writes it)
  for (NormRole role : {NormRole::q, NormRole::k}) {
    if (!norm_of(role)) continue;
    const bool q = role == NormRole::q;
    const int64_t w = spec_.norm_width(*spec_.norm(role), l);
    norm_backward(norm_of(role), role, per_head(c[q ? B::kQRaw : B::kKRaw], w),
                  c[q ? B::kInvQ : B::kInvK], per_head(s[q ? B::kGQ : B::kGK], w),
                  per_head(s[q ? B::kGQ : B::kGK], w));
    if (bf16) round_bf16(exec, s[q ? B::kGQ : B::kGK]);
  }
  if (spec_.norm(NormRole::v) && source < 0) {  // (in place, as the q and k norms')
    norm_backward(nullptr, NormRole::v, per_head(c[B::kVRaw], D), c[B::kInvV],
                  per_head(s[B::kGV], D), per_head(s[B::kGV], D));
    if (bf16) round_bf16(exec, s[B::kGV]);
  }
  if (spec_.layer[l].k_eq_v && source < 0)  // (k_proj's output fed k and v: the sum)
    residual_add(exec, s[B::kGV], bf16, s[B::kGK]);
  if (spec_.attn_output_gate) join_gated_q(exec, s[B::kGQ], s[B::kGGateA], D, s[B::kGQFull]);
  project_back_all(l, ProjectionInput::attn_norm, c, accumulate, gx);
}

template <class ExecSpace>
AttentionShape CausalLm<ExecSpace>::attention_shape(int l) const {
  AttentionShape a{tokens_ / seq_len_, seq_len_, spec_.heads, spec_.kv_heads_of(l),
                   spec_.head_dim_of(l)};
  a.attn_scale = spec_.attn_scale;
  a.softcap = spec_.attn_softcap;
  a.window = spec_.layer[l].window;
  if (blocks_[l].sinks) a.sinks = dense_vector(blocks_[l].sinks).data();
  if (docs_.data()) a.host_doc_start = host_docs_.data();
  return a;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::clip_qkv_backward(int l, Buffers& c) {
  // The clamp passes the gradient where its input was within [-c, c]: v's input is kept,
  // q's and k's (their norms' outputs, rotated since) are computed again into the then
  // free gradient of the attention output.
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const float clip = spec_.clip_qkv;
  Buffers& s = buf_;
  clip_backward(exec, clip, bf16, c[B::kVRaw], s[B::kGV]);
  for (NormRole role : {NormRole::q, NormRole::k}) {
    const bool q = role == NormRole::q;
    const int64_t w = spec_.norm_width(*spec_.norm(role), l);
    const Matrix<Mem> raw = c[q ? B::kQRaw : B::kKRaw];
    const Matrix<Mem> normed(s[B::kGAtt].data(), tokens_, raw.extent(1));
    norm_forward(blocks_[l].norm[static_cast<int>(role)], role, per_head(raw, w),
                 per_head(normed, w), c[q ? B::kInvQ : B::kInvK]);
    clip_backward(exec, clip, bf16, normed, s[q ? B::kGQ : B::kGK]);
  }
}

// (this file's members of the one instantiation, causal_lm.cpp)
template void CausalLm<Kokkos::DefaultExecutionSpace>::attention_forward(int, Buffers&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::attention_backward(int, Buffers&,
                                                                          const Matrix<Mem>&, bool,
                                                                          const Matrix<Mem>&);
template AttentionShape CausalLm<Kokkos::DefaultExecutionSpace>::attention_shape(int) const;
template void CausalLm<Kokkos::DefaultExecutionSpace>::attention_views(int, Buffers&);
template auto CausalLm<Kokkos::DefaultExecutionSpace>::shared_kv(int, bool, bool) -> Matrix<Mem>;
template void CausalLm<Kokkos::DefaultExecutionSpace>::clip_qkv_backward(int, Buffers&);

}  // namespace kqlora
