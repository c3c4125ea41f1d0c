// The dense MLP sublayer of a decoder block: gate and up projections (or a fused
// gate_up), the gated activation, the down projection; forward and backward.
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/gated_mlp.hpp"

namespace kqlora {

namespace {

using B = DecoderBuffers;

}  // namespace

template <class ExecSpace>
void CausalLm<ExecSpace>::dense_mlp_forward(int l, Buffers& c) {
  mlp_views(l, c);
  project_all(l, ProjectionInput::mlp_norm, c);
  gated_mlp_forward(this->exec_, spec_.mlp_activation, c[B::kGate], c[B::kUp], this->cfg_.bf16(),
                    c[B::kAct]);
  // (its adapter's h and dropout mask too; a shared expert's output kept apart, the
  // experts adding to it through its gate: decoder_sparse_mlp.cpp)
  if (spec_.dense_beside_experts(l))
    project(l, spec_.writer(Slot::down), c, c[B::kShared]);
  else
    project_all(l, ProjectionInput::mlp_act, c);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::dense_mlp_backward(int l, Buffers& c, const Matrix<Mem>& g_down,
                                             bool accumulate, const Matrix<Mem>& gx,
                                             float gx_beta) {
  mlp_views(l, c);
  Buffers& s = buf_;
  project_back(l, spec_.writer(Slot::down), c, g_down, accumulate, 0.0f, s[B::kGAct]);
  gated_mlp_backward(this->exec_, spec_.mlp_activation, c[B::kGate], c[B::kUp], s[B::kGAct],
                     this->cfg_.bf16(), s[B::kGGate], s[B::kGUp]);
  project_back_all(l, ProjectionInput::mlp_norm, c, accumulate, gx, gx_beta);
}

// (this file's members of the one instantiation, causal_lm.cpp)
template void CausalLm<Kokkos::DefaultExecutionSpace>::dense_mlp_forward(int, Buffers&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::dense_mlp_backward(int, Buffers&,
                                                                          const Matrix<Mem>&, bool,
                                                                          const Matrix<Mem>&,
                                                                          float);

}  // namespace kqlora
