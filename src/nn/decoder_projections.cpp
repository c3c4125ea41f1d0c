// The decoder's projections (CausalLm::project and its backward): an NF4 weight with its
// LoRA adapter, optional dropout and bias, reading one of the block's inputs and writing
// one slot, or several for a fused projection (docs/MODELS.md).
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/fused_columns.hpp"

namespace kqlora {

namespace {

using B = DecoderBuffers;

}  // namespace

template <class ExecSpace>
auto CausalLm<ExecSpace>::adapter(int l, int p) const -> LoraAdapterViews<Mem> {
  const Projection& x = blocks_[l].proj[p];
  LoraAdapterViews<Mem> v;
  v.a = this->matrix(this->compute_, *x.a);
  v.b = this->matrix(this->compute_, *x.b);
  v.ga = this->matrix(this->grads, *x.a);
  v.gb = this->matrix(this->grads, *x.b);
  v.scale = this->cfg_.scale();
  return v;
}

template <class ExecSpace>
DropoutKey CausalLm<ExecSpace>::dropout_key(int l, int p, int64_t features) const {
  // Keyed by (step, global sequence, position, layer, projection, feature): rows are the
  // tokens of global sequences, so the sample index counts tokens -- of the data file's
  // rows, a trimmed batch's being shorter.
  const int P = static_cast<int>(spec_.projections.size());
  return {this->cfg_.seed,
          layer_stream(RandomStream::dropout, l * P + p),
          step_,
          global_bs_ * row_len_,
          first_sample_ * row_len_,
          features,
          static_cast<float>(this->cfg_.dropout)};
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::slot_output(Buffers& c, Slot s) -> Matrix<Mem> {
  const bool qk_norm = spec_.norm(NormRole::q) != nullptr;
  switch (s) {
    case Slot::q:  // (a gated attention's [q | gate] first, split_gated_q)
      return spec_.attn_output_gate ? c[B::kQFull] : qk_norm ? c[B::kQRaw] : c[B::kQ];
    case Slot::k:
      return qk_norm ? c[B::kKRaw] : c[B::kK];
    case Slot::v:  // (its raw copy, kept for a clamp's or the v norm's backward)
      return spec_.clip_qkv > 0 || spec_.norm(NormRole::v) ? c[B::kVRaw] : c[B::kV];
    case Slot::o:
    case Slot::lin_out:
      return spec_.norm(NormRole::attn_out) ? c[B::kORaw] : buf_[B::kProjOut];
    case Slot::gate:
      return c[B::kGate];
    case Slot::up:
      return c[B::kUp];
    case Slot::lin_qkv:
      return c[B::kLinMixed];
    case Slot::lin_z:
      return c[B::kLinZ];
    case Slot::lin_b:
      return c[B::kLinB];
    case Slot::lin_a:
      return c[B::kLinA];
    case Slot::ple_gate:
      return c[B::kPleGate];
    case Slot::ple_out:
      return c[B::kPleRaw];
    default:
      return spec_.norm(NormRole::mlp_out) ? c[B::kDRaw] : buf_[B::kProjOut];
  }
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::slot_gradient(Slot s) -> Matrix<Mem> {
  switch (s) {
    case Slot::q:
      return spec_.attn_output_gate ? buf_[B::kGQFull] : buf_[B::kGQ];
    case Slot::k:
      return buf_[B::kGK];
    case Slot::v:
      return buf_[B::kGV];
    case Slot::gate:
      return buf_[B::kGGate];
    case Slot::lin_qkv:
      return buf_[B::kGLinMixed];
    case Slot::lin_z:
      return buf_[B::kGLinZ];
    case Slot::lin_b:
      return buf_[B::kGLinB];
    case Slot::lin_a:
      return buf_[B::kGLinA];
    case Slot::ple_gate:  // (its gradient in place of act(gate) * input's)
      return buf_[B::kGPleAct];
    default:
      return buf_[B::kGUp];
  }
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::projection_input(const Buffers& c, int p) const -> Matrix<Mem> {
  switch (spec_.projections[p].input) {
    case ProjectionInput::attn_norm:
      return sublayer_input(c, NormRole::attn_in);
    case ProjectionInput::attn_out:  // (a gated attention's output times its gates)
      return spec_.attn_output_gate ? c[B::kAttGated] : c[B::kAtt];
    case ProjectionInput::mlp_norm:
      return sublayer_input(c, NormRole::mlp_in);
    case ProjectionInput::linear_out:
      return c[B::kLinOut];
    case ProjectionInput::block_out:
      return c[B::kPleIn];
    case ProjectionInput::ple_act:
      return c[B::kPleAct];
    default:
      return c[B::kAct];
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project(int l, int p, Buffers& c, const Matrix<Mem>& out) {
  const bool bf16 = this->cfg_.bf16();
  const ProjectionSpec& spec = spec_.projections[p];
  const Projection& P = blocks_[l].proj[p];
  const Matrix<Mem> x = projection_input(c, p);
  const bool fused = spec.slots.size() > 1;
  const Matrix<Mem> y =
      fused ? Matrix<Mem>(buf_[B::kFused].data(), tokens_, spec_.out_features(spec, l))
            : (out.data() ? out : slot_output(c, spec.slots[0]));
  const Kokkos::View<const float*, Mem> bias =
      P.bias ? dense_vector(P.bias) : Kokkos::View<const float*, Mem>();
  if (!P.a) {
    lora_projection_forward<ExecSpace, Mem>(this->exec_, this->nf4[P.w->offset], nullptr, x, x,
                                            bf16, Matrix<Mem>(), lora_, ws_, y, bias);
  } else {
    Matrix<Mem> xd = x;
    if (dropout_on_) {
      xd = c[DecoderBuffers::xd(p)];
      dropout_apply(this->exec_, dropout_key(l, p, x.extent(1)), bf16, x, xd, 0.0f);
    }
    const auto lora = adapter(l, p);
    lora_projection_forward(this->exec_, this->nf4[P.w->offset], &lora, x, xd, bf16,
                            c[DecoderBuffers::h(p)], lora_, ws_, y, bias);
  }
  if (!fused) return;
  if (spec.groups > 0) {
    int64_t off = 0;
    for (const SlotPiece& piece : spec_.pieces(spec)) {
      const GroupedPiece g{spec.groups, spec_.out_features(spec, l) / spec.groups, off, piece.col0,
                           piece.width};
      take_grouped_columns(this->exec_, y, g, slot_output(c, piece.slot));
      off += piece.width / spec.groups;
    }
    return;
  }
  int64_t col = 0;
  for (Slot s : spec.slots) {
    take_columns(this->exec_, y, col, slot_output(c, s));
    col += spec_.slot_width(s, l);
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project_back(int l, int p, const Buffers& c, const Matrix<Mem>& gy,
                                       bool accumulate, float gx_beta, const Matrix<Mem>& gx) {
  const bool bf16 = this->cfg_.bf16();
  const Projection& P = blocks_[l].proj[p];
  const auto& W = this->nf4[P.w->offset];
  if (!P.a) {
    if (gx.data())
      lora_projection_backward<ExecSpace, Mem>(this->exec_, W, nullptr, gy, Matrix<Mem>(),
                                               Matrix<Mem>(), accumulate, nullptr, bf16, lora_, ws_,
                                               gx_beta, gx);
    return;
  }
  const auto lora = adapter(l, p);
  const DropoutKey key = dropout_key(l, p, spec_.in_features(spec_.projections[p], l));
  // The input this projection read: its dropped-out copy, or the shared input itself.
  const Matrix<Mem> x_read = dropout_on_ ? c[DecoderBuffers::xd(p)] : projection_input(c, p);
  lora_projection_backward(this->exec_, W, &lora, gy, x_read, c[DecoderBuffers::h(p)], accumulate,
                           dropout_on_ ? &key : nullptr, bf16, lora_, ws_, gx_beta, gx);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project_back_all(int l, ProjectionInput in, const Buffers& c,
                                           bool accumulate, const Matrix<Mem>& gx, float gx_beta) {
  float beta = gx_beta;
  for (size_t p = 0; p < spec_.projections.size(); ++p) {
    const ProjectionSpec& spec = spec_.projections[p];
    if (spec.input != in || !spec_.has_projection(l, spec)) continue;
    Matrix<Mem> gy = slot_gradient(spec.slots[0]);
    if (spec.slots.size() > 1) {  // gather the slots' gradients into the fused one's
      gy = Matrix<Mem>(buf_[B::kGFused].data(), tokens_, spec_.out_features(spec, l));
      int64_t col = 0;
      if (spec.groups > 0) {
        for (const SlotPiece& piece : spec_.pieces(spec)) {
          const GroupedPiece g{spec.groups, spec_.out_features(spec, l) / spec.groups, col,
                               piece.col0, piece.width};
          put_grouped_columns(this->exec_, slot_gradient(piece.slot), g, gy);
          col += piece.width / spec.groups;
        }
      } else {
        for (Slot s : spec.slots) {
          put_columns(this->exec_, slot_gradient(s), col, gy);
          col += spec_.slot_width(s, l);
        }
      }
    }
    project_back(l, static_cast<int>(p), c, gy, accumulate, beta, gx);
    beta = 1.0f;
  }
}

template <class ExecSpace>
void CausalLm<ExecSpace>::project_all(int l, ProjectionInput in, Buffers& c) {
  for (size_t p = 0; p < spec_.projections.size(); ++p)
    if (spec_.projections[p].input == in && spec_.has_projection(l, spec_.projections[p]))
      project(l, static_cast<int>(p), c);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::mlp_views(int l, Buffers& c) {
  // (views from each buffer's start: its storage is the widest layer's)
  const auto narrow = [&](Matrix<Mem>& m, int64_t width) {
    if (m.data()) m = Matrix<Mem>(m.data(), tokens_, width);
  };
  const int64_t w = spec_.mlp_width(l);
  for (int i : {B::kGate, B::kUp, B::kAct}) narrow(c[i], w);
  for (int i : {B::kGAct, B::kGGate, B::kGUp}) narrow(buf_[i], w);
  for (size_t p = 0; p < spec_.projections.size(); ++p)
    if (spec_.projections[p].input == ProjectionInput::mlp_act)
      narrow(c[DecoderBuffers::xd(static_cast<int>(p))], w);
}

// (this file's members of the one instantiation, causal_lm.cpp)
template auto CausalLm<Kokkos::DefaultExecutionSpace>::adapter(int, int) const
    -> LoraAdapterViews<Mem>;
template DropoutKey CausalLm<Kokkos::DefaultExecutionSpace>::dropout_key(int, int, int64_t) const;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::slot_output(Buffers&, Slot) -> Matrix<Mem>;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::slot_gradient(Slot) -> Matrix<Mem>;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::projection_input(const Buffers&, int) const
    -> Matrix<Mem>;
template void CausalLm<Kokkos::DefaultExecutionSpace>::project(int, int, Buffers&,
                                                               const Matrix<Mem>&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::mlp_views(int, Buffers&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::project_back(int, int, const Buffers&,
                                                                    const Matrix<Mem>&, bool, float,
                                                                    const Matrix<Mem>&);
template void CausalLm<Kokkos::DefaultExecutionSpace>::project_back_all(int, ProjectionInput,
                                                                        const Buffers&, bool,
                                                                        const Matrix<Mem>&, float);
template void CausalLm<Kokkos::DefaultExecutionSpace>::project_all(int, ProjectionInput, Buffers&);

}  // namespace kqlora
