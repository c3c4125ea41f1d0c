// The sparse MLP sublayer of a decoder block (the experts; nn/sparse_mlp.hpp): its
// buffers, its experts' weights and adapters, forward and backward, and the router's
// load-balancing loss over a forward (docs/MODELS.md, "Experts").
#include "decoder_names.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/residual.hpp"
#include "kqlora/nn/router_input_norm.hpp"
#include "kqlora/nn/shared_expert_gate.hpp"
#include "kqlora/nn/sparse_mlp.hpp"

namespace kqlora {

namespace {

using B = DecoderBuffers;
using decoder::flat;

}  // namespace

template <class ExecSpace>
void CausalLm<ExecSpace>::experts_forward(int l, Buffers& c, bool sum_aux) {
  if (spec_.experts.beside) return moe_block_forward(l, c, sum_aux);
  SparseMlpCache<Mem> sc = sparse_cache(c);
  sparse_mlp_forward(this->exec_, spec_.experts, spec_.mlp_activation, router_weights(l),
                     expert_weights(l), sublayer_input(c, NormRole::mlp_in), this->cfg_.bf16(), sc,
                     lora_, ws_, slot_output(c, Slot::down), sum_aux ? &aux_ : nullptr,
                     buf_[B::kGLogits]);
  offsets_[l] = std::move(sc.offsets);
  if (spec_.shared_expert(l))  // (its output in c[kShared]: block_forward ran it first)
    shared_expert_gate_forward(
        this->exec_, sublayer_input(c, NormRole::mlp_in), dense_vector(blocks_[l].shared_gate),
        c[B::kShared], this->cfg_.bf16(), flat(c[B::kSharedGate]), slot_output(c, Slot::down));
}

template <class ExecSpace>
void CausalLm<ExecSpace>::moe_block_forward(int l, Buffers& c, bool sum_aux) {
  // Gemma 4 (docs/MODELS.md): d = dense_out(dense MLP of mlp_in(m)) +
  // experts_out(experts of experts_in(m), routed by unitnorm(m) * scale * hidden^-1/2);
  // the dense MLP ran first (block_forward), its output in kShared.
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  router_input_forward(exec, c[B::kMid], dense_vector(B.router_scale), router_root(),
                       static_cast<float>(spec_.norm_eps), bf16, c[B::kRouterIn],
                       flat(c[B::kInvRouter]));
  norm_forward(norm_of(NormRole::experts_in), NormRole::experts_in, c[B::kMid], c[B::kN3],
               c[B::kInv3]);
  SparseMlpCache<Mem> sc = sparse_cache(c);
  sparse_mlp_forward(exec, spec_.experts, spec_.mlp_activation, router_weights(l),
                     expert_weights(l), c[B::kN3], bf16, sc, lora_, ws_, c[B::kExpertsRaw],
                     sum_aux ? &aux_ : nullptr, buf_[B::kGLogits], c[B::kRouterIn]);
  offsets_[l] = std::move(sc.offsets);
  const Matrix<Mem> d = slot_output(c, Slot::down);
  norm_forward(norm_of(NormRole::dense_out), NormRole::dense_out, c[B::kShared], d, c[B::kInvE1]);
  norm_forward(norm_of(NormRole::experts_out), NormRole::experts_out, c[B::kExpertsRaw],
               buf_[B::kMoeTmp], c[B::kInvE2]);
  residual_add(exec, buf_[B::kMoeTmp], bf16, d);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::moe_block_backward(int l, Buffers& c, const Matrix<Mem>& g_out,
                                             bool accumulate, const Matrix<Mem>& gx) {
  // g_out: the sum's gradient (each branch's); the experts' and the router's inputs add
  // their gradients into the residual's (kG) through their own norms, the dense MLP's
  // into gx (the mlp_in norm's output, block backward's next step).
  const ExecSpace& exec = this->exec_;
  const bool bf16 = this->cfg_.bf16();
  const Block& B = blocks_[l];
  const auto norm_of = [&](NormRole r) { return B.norm[static_cast<int>(r)]; };
  Buffers& s = buf_;
  norm_backward(norm_of(NormRole::experts_out), NormRole::experts_out, c[B::kExpertsRaw],
                c[B::kInvE2], g_out, s[B::kMoeTmp]);
  if (bf16) round_bf16(exec, s[B::kMoeTmp]);
  SparseMlpCache<Mem> sc = sparse_cache(c);
  sc.offsets = offsets_[l];
  sparse_mlp_backward(exec, spec_.experts, spec_.mlp_activation, router_weights(l),
                      expert_weights(l), sc, s[B::kMoeTmp], bf16, sparse_scratch(), lora_, ws_,
                      s[B::kGN3], aux_on_ ? &aux_ : nullptr, s[B::kGRouterIn]);
  norm_backward(norm_of(NormRole::experts_in), NormRole::experts_in, c[B::kMid], c[B::kInv3],
                s[B::kGN3], s[B::kG], NormGradOut::add);
  router_input_backward(exec, c[B::kMid], dense_vector(B.router_scale), router_root(),
                        Kokkos::View<const float*, Mem>(flat(c[B::kInvRouter])), bf16,
                        s[B::kGRouterIn], s[B::kG]);
  norm_backward(norm_of(NormRole::dense_out), NormRole::dense_out, c[B::kShared], c[B::kInvE1],
                g_out, s[B::kGShared]);
  if (bf16) round_bf16(exec, s[B::kGShared]);
  dense_mlp_backward(l, c, s[B::kGShared], accumulate, gx, 0.0f);
}

template <class ExecSpace>
void CausalLm<ExecSpace>::experts_backward(int l, Buffers& c, const Matrix<Mem>& g_out,
                                           bool accumulate, const Matrix<Mem>& gx) {
  const ExecSpace& exec = this->exec_;
  const Block& B = blocks_[l];
  // (the experts' adapters add up their gradients: each expert's A from gate and up, and an
  // expert no token chose keeps a zero gradient)
  const ParamEntry* expert_adapters[] = {B.gate_up_lora.first, B.gate_up_lora.second,
                                         B.down_lora.first, B.down_lora.second};
  if (!accumulate)
    for (const ParamEntry* e : expert_adapters)
      if (e)
        Kokkos::deep_copy(
            exec, Kokkos::subview(this->grads, std::make_pair(e->offset, e->offset + e->numel())),
            0.0f);
  if (spec_.experts.beside) return moe_block_backward(l, c, g_out, accumulate, gx);
  SparseMlpCache<Mem> sc = sparse_cache(c);
  sc.offsets = offsets_[l];
  sparse_mlp_backward(exec, spec_.experts, spec_.mlp_activation, router_weights(l),
                      expert_weights(l), sc, g_out, this->cfg_.bf16(), sparse_scratch(), lora_, ws_,
                      gx, aux_on_ ? &aux_ : nullptr);
  if (spec_.shared_expert(l)) {  // the gate's path into gx, then the shared expert's
    shared_expert_gate_backward(exec, g_out, dense_vector(B.shared_gate), c[B::kShared],
                                Kokkos::View<const float*, Mem>(flat(c[B::kSharedGate])),
                                this->cfg_.bf16(), buf_[B::kGShared], gx);
    dense_mlp_backward(l, c, buf_[B::kGShared], accumulate, gx, 1.0f);
  }
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::sparse_cache(Buffers& c) const -> SparseMlpCache<Mem> {
  // (the index buffers hold int32 in their floats' place: one 4-byte value each)
  const int64_t T = tokens_, K = spec_.experts.top_k, H = spec_.hidden;
  const int64_t I = spec_.experts.intermediate;
  const auto ints = [&](size_t i, int64_t rows, int64_t cols) {
    return IndexMatrix<Mem>(reinterpret_cast<int32_t*>(c[i].data()), rows, cols);
  };
  SparseMlpCache<Mem> sc;
  sc.logits = c[B::kLogits];
  sc.weight = c[B::kWeight];
  sc.chosen = ints(B::kChosen, T, K);
  sc.where = ints(B::kWhere, T, K);
  sc.order = ints(B::kOrder, T * K, 1);
  sc.xg = Matrix<Mem>(c[B::kXg].data(), T * K, H);
  sc.gate = Matrix<Mem>(c[B::kGateG].data(), T * K, I);
  sc.up = Matrix<Mem>(c[B::kUpG].data(), T * K, I);
  sc.act = Matrix<Mem>(c[B::kActG].data(), T * K, I);
  sc.yg = Matrix<Mem>(c[B::kYg].data(), T * K, H);
  const int64_t r = this->cfg_.rank;
  if (c[B::kHGateUp].data()) sc.h_gate_up = Matrix<Mem>(c[B::kHGateUp].data(), T * K, r);
  if (c[B::kHDown].data()) sc.h_down = Matrix<Mem>(c[B::kHDown].data(), T * K, r);
  return sc;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::sparse_scratch() const -> SparseMlpScratch<Mem> {
  const int64_t T = tokens_, K = spec_.experts.top_k, H = spec_.hidden;
  const int64_t I = spec_.experts.intermediate;
  SparseMlpScratch<Mem> s;
  s.gyg = Matrix<Mem>(buf_[B::kGYg].data(), T * K, H);
  s.gxg = Matrix<Mem>(buf_[B::kGXg].data(), T * K, H);
  s.gact = Matrix<Mem>(buf_[B::kGActG].data(), T * K, I);
  s.ggate = Matrix<Mem>(buf_[B::kGGateG].data(), T * K, I);
  s.gup = Matrix<Mem>(buf_[B::kGUpG].data(), T * K, I);
  s.gw = buf_[B::kGW];
  s.glogits = buf_[B::kGLogits];
  return s;
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::router_weights(int l) const -> RouterWeights<Mem> {
  const Block& B = blocks_[l];
  return {
      dense_matrix(B.router),
      B.router_bias ? dense_vector(B.router_bias) : Kokkos::View<const float*, Mem>(),
      B.per_expert_scale ? dense_vector(B.per_expert_scale) : Kokkos::View<const float*, Mem>()};
}

template <class ExecSpace>
auto CausalLm<ExecSpace>::expert_weights(int l) const -> std::vector<ExpertWeights<Mem>> {
  const Block& B = blocks_[l];
  const int64_t r = this->cfg_.rank, H = spec_.hidden, I = spec_.experts.intermediate;
  // Expert j's rows of an expert-major [E * rows, cols] entry of a flat buffer.
  const auto rows_of = [&](const Vec& v, const ParamEntry* e, int64_t j, int64_t first,
                           int64_t rows) {
    const int64_t cols = e->shape[1];
    return Matrix<Mem>(
        v.data() + e->offset + (j * (e->shape[0] / spec_.experts.experts) + first) * cols, rows,
        cols);
  };
  const auto adapter = [&](const std::pair<const ParamEntry*, const ParamEntry*>& ab, int64_t j,
                           int64_t first, int64_t rows) {
    LoraAdapterViews<Mem> v;
    v.a = rows_of(this->compute_, ab.first, j, 0, r);
    v.ga = rows_of(this->grads, ab.first, j, 0, r);
    v.b = rows_of(this->compute_, ab.second, j, first, rows);
    v.gb = rows_of(this->grads, ab.second, j, first, rows);
    v.scale = this->cfg_.scale();
    return v;
  };
  std::vector<ExpertWeights<Mem>> w;
  for (size_t j = 0; j < B.experts.size(); ++j) {
    const Expert& e = B.experts[j];
    ExpertWeights<Mem> x;
    x.gate = &this->nf4[e.gate->offset];
    x.up = &this->nf4[e.up->offset];
    x.down = &this->nf4[e.down->offset];
    x.gate_up_lora = B.gate_up_lora.first != nullptr;
    x.down_lora = B.down_lora.first != nullptr;
    if (x.gate_up_lora) {
      x.gate_ad = adapter(B.gate_up_lora, static_cast<int64_t>(j), 0, I);
      x.up_ad = adapter(B.gate_up_lora, static_cast<int64_t>(j), I, I);
    }
    if (x.down_lora) x.down_ad = adapter(B.down_lora, static_cast<int64_t>(j), 0, H);
    if (B.gate_bias) {  // (expert j's row of each [E, width] bias)
      const auto row = [&](const ParamEntry* e, int64_t width) {
        return Kokkos::View<const float*, Mem>(dense_vector(e).data() + j * width, width);
      };
      x.gate_bias = row(B.gate_bias, I);
      x.up_bias = row(B.up_bias, I);
      x.down_bias = row(B.down_bias, H);
    }
    w.push_back(x);
  }
  return w;
}

template <class ExecSpace>
void CausalLm<ExecSpace>::mark_real_tokens(const TokenMatrix<Mem>& labels) {
  const int64_t n = labels.extent(0), S = labels.extent(1);
  if (static_cast<int64_t>(aux_.real.extent(0)) < n * S)
    aux_.real = Kokkos::View<float*, Mem>("kqlora::CausalLm::aux_real", n * S);
  const double tokens = kqlora::mark_real_tokens(this->exec_, labels, aux_.real);
  Kokkos::deep_copy(this->exec_, aux_.counts, 0.0);
  Kokkos::deep_copy(this->exec_, aux_.probs, 0.0);
  int64_t sparse = 0;
  for (const LayerSpec& l : spec_.layer) sparse += l.sparse;
  aux_.rows = tokens * static_cast<double>(sparse);
}

template <class ExecSpace>
double CausalLm<ExecSpace>::finish_aux_loss(int64_t rows, int64_t global_bs) {
  // One micro-batch's loss, weighted by its share of the global batch's rows: a mean over
  // the micro-batches and ranks, each computed as transformers computes one forward's.
  const int64_t E = spec_.experts.experts;
  auto counts = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.counts);
  auto probs = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.probs);
  Kokkos::deep_copy(this->exec_, counts, aux_.counts);
  Kokkos::deep_copy(this->exec_, probs, aux_.probs);
  fence(this->exec_, "kqlora::CausalLm::aux_sums");  // (read on the host below)
  const double R = aux_.rows, scale = spec_.experts.aux_loss_coef * static_cast<double>(rows) /
                                      static_cast<double>(global_bs);
  auto grad = Kokkos::create_mirror_view(Kokkos::HostSpace(), aux_.grad);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    aux += R > 0 ? counts(e) / R * probs(e) / R : 0;
    grad(e) = R > 0 ? static_cast<float>(scale * static_cast<double>(E) * counts(e) / (R * R)) : 0;
  }
  Kokkos::deep_copy(this->exec_, aux_.grad, grad);
  fence(this->exec_, "kqlora::CausalLm::aux_grad");  // (grad is freed on return)
  return scale * static_cast<double>(E) * aux;
}

// (this file's members of the one instantiation, causal_lm.cpp)
template void CausalLm<Kokkos::DefaultExecutionSpace>::experts_forward(int, Buffers&, bool);
template void CausalLm<Kokkos::DefaultExecutionSpace>::experts_backward(int, Buffers&,
                                                                        const Matrix<Mem>&, bool,
                                                                        const Matrix<Mem>&);
template auto CausalLm<Kokkos::DefaultExecutionSpace>::sparse_cache(Buffers&) const
    -> SparseMlpCache<Mem>;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::sparse_scratch() const
    -> SparseMlpScratch<Mem>;
template void CausalLm<Kokkos::DefaultExecutionSpace>::moe_block_forward(int, Buffers&, bool);
template void CausalLm<Kokkos::DefaultExecutionSpace>::moe_block_backward(int, Buffers&,
                                                                          const Matrix<Mem>&, bool,
                                                                          const Matrix<Mem>&);
template auto CausalLm<Kokkos::DefaultExecutionSpace>::router_weights(int) const
    -> RouterWeights<Mem>;
template auto CausalLm<Kokkos::DefaultExecutionSpace>::expert_weights(int) const
    -> std::vector<ExpertWeights<Mem>>;
template void CausalLm<Kokkos::DefaultExecutionSpace>::mark_real_tokens(const TokenMatrix<Mem>&);
template double CausalLm<Kokkos::DefaultExecutionSpace>::finish_aux_loss(int64_t, int64_t);

}  // namespace kqlora
