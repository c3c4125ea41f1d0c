// A Gated DeltaNet layer of the decoder (Qwen3.5's linear attention; docs/MODELS.md, "Gated
// DeltaNet"): its four input projections, the token mixer between them and out_proj
// (nn/gated_deltanet.hpp), and out_proj; forward and backward.
#include "decoder_names.hpp"
#include "kqlora/nn/causal_lm.hpp"

namespace kqlora {

namespace {

using B = DecoderBuffers;
using decoder::flat;

}  // namespace

template <class ExecSpace>
auto CausalLm<ExecSpace>::linear_weights(int l) const -> GatedDeltaNetWeights<Mem> {
  const Block& b = blocks_[l];
  return {dense_vector(b.lin_conv), dense_vector(b.lin_a_log), dense_vector(b.lin_dt_bias),
          dense_vector(b.lin_norm)};
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::linear_buffers(int l, Buffers& c) -> GatedDeltaNetBuffers<Mem> {
  const LinearAttentionSpec& L = spec_.linear;
  // (the chunks' states: the layer's own, or with activation checkpointing one set, which
  // the recomputation writes again)
  const size_t at = this->cfg_.activation_checkpointing ? 0 : static_cast<size_t>(l);
  if (lin_states_.size() <= at) lin_states_.resize(at + 1);
  const int64_t n = lin_docs_.chunks * L.value_heads * L.key_dim * L.value_dim;
  if (static_cast<int64_t>(lin_states_[at].extent(0)) < n) {
    lin_states_[at] = Kokkos::View<float*, Mem>();
    lin_states_[at] = Kokkos::View<float*, Mem>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::CausalLm::lin_states"), n);
  }
  GatedDeltaNetBuffers<Mem> v;
  v.conv = c[B::kLinConv];
  v.q = c[B::kLinQ];
  v.k = c[B::kLinK];
  v.v = c[B::kLinV];
  v.beta = c[B::kLinBeta];
  v.g = c[B::kLinG];
  v.core = c[B::kLinCore];
  v.inv_q = flat(c[B::kLinInvQ]);
  v.inv_k = flat(c[B::kLinInvK]);
  v.inv_norm = flat(c[B::kLinInvNorm]);
  v.states = lin_states_[at];
  v.d_core = buf_[B::kGLinCore];
  v.dq_per_value = buf_[B::kGLinQv];
  v.dk_per_value = buf_[B::kGLinKv];
  v.dq = buf_[B::kGLinQ];
  v.dk = buf_[B::kGLinK];
  v.dv = buf_[B::kGLinV];
  v.dbeta = buf_[B::kGLinBeta];
  v.dg = buf_[B::kGLinG];
  v.d_conv = buf_[B::kGLinConv];
  v.tokens = tokens_;
  v.chunks = lin_docs_.chunks;
  return v;
}

template <class ExecSpace>
GatedDeltaNetShape CausalLm<ExecSpace>::linear_shape() const {
  const LinearAttentionSpec& L = spec_.linear;
  GatedDeltaNetShape s;
  s.rule = {L.key_heads, L.value_heads, L.key_dim, L.value_dim};
  s.kernel = L.kernel;
  s.norm_eps = static_cast<float>(spec_.norm_eps);
  return s;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::linear_attention_forward(int l, Buffers& c) {
  const bool bf16 = this->cfg_.bf16();
  project_all(l, ProjectionInput::attn_norm, c);
  auto buffers = linear_buffers(l, c);
  gated_deltanet_forward(this->exec_, linear_shape(), lin_docs_, seq_len_, docs_, c[B::kLinMixed],
                         c[B::kLinZ], c[B::kLinB], c[B::kLinA], linear_weights(l), bf16, buffers,
                         c[B::kLinOut]);
  project_all(l, ProjectionInput::linear_out, c);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::linear_attention_backward(int l, Buffers& c, const Matrix<Mem>& g_o,
                                                    bool accumulate, const Matrix<Mem>& gx) {
  const bool bf16 = this->cfg_.bf16();
  Buffers& s = buf_;
  project_back(l, spec_.writer(Slot::lin_out), c, g_o, accumulate, 0.0f, s[B::kGLinOut]);
  auto buffers = linear_buffers(l, c);
  gated_deltanet_backward(this->exec_, linear_shape(), lin_docs_, seq_len_, docs_, c[B::kLinMixed],
                          c[B::kLinZ], c[B::kLinA], linear_weights(l), bf16, buffers,
                          s[B::kGLinOut], s[B::kGLinMixed], s[B::kGLinZ], s[B::kGLinB],
                          s[B::kGLinA]);
  project_back_all(l, ProjectionInput::attn_norm, c, accumulate, gx);
}

// (this file's members of the one instantiation, causal_lm.cpp)
template auto CausalLm<Kokkos::DefaultExecutionSpace>::linear_weights(int) const
    -> GatedDeltaNetWeights<Mem>;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::linear_buffers(int, Buffers&)
    -> GatedDeltaNetBuffers<Mem>;
template GatedDeltaNetShape CausalLm<Kokkos::DefaultExecutionSpace>::linear_shape() const;
template void CausalLm<Kokkos::DefaultExecutionSpace>::linear_attention_forward(int, Buffers&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::linear_attention_backward(
    int, Buffers&, const Matrix<Mem>&, bool, const Matrix<Mem>&);

}  // namespace kqlora
