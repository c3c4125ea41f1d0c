#pragma once
// A frozen NF4 projection with an optional frozen bias b and LoRA adapter (torchtune's and
// PEFT's LoRALinear):
//   y = x W^T + b + scale * (dropout(x) A^T) B^T,   scale = alpha / rank,
// and its backward: the adapter's gradients dA, dB and, when asked, the input gradient
//   gx = gy W + dropout^T(scale * gy B A).
// In bfloat16 the products are rounded as PyTorch rounds them (h = R(x_d A^T), y = R(x W^T + b)
// -- the bias added before the base's single rounding, as addmm does --,
// y = R(y + R(scale * R(h B^T)))). Several projections reading one input (q, k, v; gate,
// up) add their input gradients into one gx (gx_beta 1 after the first).

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/linear_nf4.hpp"

namespace kqlora {

/// The adapter of one projection: A [rank, in] and B [out, rank] as the products read them
/// (the masters, or their bfloat16 roundings), their gradients, the scale.
template <class M>
struct LoraAdapterViews {
  Matrix<M> a, b, ga, gb;
  float scale = 1.0f;
};

/// Scratch of the projections: h [tokens, rank] per adapter is the caller's (the backward
/// needs it); these are shared.
template <class M>
struct LoraScratch {
  Matrix<M> gh;                 // [tokens, rank]
  Matrix<M> tmp;                // [tokens, max(in, out)]: bfloat16 and dropout products
  Kokkos::View<float*, M> gbt;  // dB^T [rank, out] (grown as needed)
};

namespace impl {

/// dB^T [rank, out] in the scratch: dB = s gy^T h + beta dB ([out, rank]) is computed as
/// the transpose of s h^T gy ([rank, out]): the host GEMM engine ran the [1536, 8] product
/// over 1024 tokens 2.5x slower than the [8, 1536] one (oneDNN 2.6, docs/BENCHMARKS.md), and
/// the transpose of a rank-wide matrix is cheap.
template <class M>
Matrix<M> lora_b_gradient_transposed(LoraScratch<M>& scratch, int64_t out, int64_t r) {
  if (static_cast<int64_t>(scratch.gbt.extent(0)) < out * r)
    scratch.gbt = Kokkos::View<float*, M>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::LoraScratch::gbt"), out * r);
  return Matrix<M>(scratch.gbt.data(), r, out);
}

/// gb = t^T + beta gb.
template <class ExecSpace, class M>
void lora_b_gradient_store(const ExecSpace& exec, const Matrix<M>& t, float beta,
                           const Matrix<M>& gb) {
  Kokkos::parallel_for(
      "kqlora::lora::b_gradient", over(exec, gb.extent(0), gb.extent(1)),
      KOKKOS_LAMBDA(int64_t o, int64_t j) {
        gb(o, j) = beta == 0.0f ? t(j, o) : beta * gb(o, j) + t(j, o);
      });
}

/// The base product's inputs: bfloat16 values in a bfloat16 run over a bfloat16 NF4 weight
/// (the activations and gradients are rounded to bfloat16 there), float32 otherwise.
template <class M>
GemmInputs base_inputs(const Nf4Tensor<M>& W, bool bf16) {
  return bf16 && W.layout.dtype == DType::bfloat16 ? GemmInputs::bfloat16 : GemmInputs::float32;
}

}  // namespace impl

/// y = x W^T + bias (+ the adapter's output, h = x_d A^T kept for the backward). `lora`
/// null: no adapter; `bias` empty: none. xd is dropout(x), or x itself.
template <class ExecSpace, class M>
void lora_projection_forward(const ExecSpace& exec, const Nf4Tensor<M>& W,
                             const LoraAdapterViews<M>* lora, const Matrix<M>& x,
                             const Matrix<M>& xd, bool bf16, const Matrix<M>& h,
                             LoraScratch<M>& scratch, LinearNf4Workspace<M>& ws, const Matrix<M>& y,
                             const Kokkos::View<const float*, M>& bias = {}) {
  // h = x A^T within the base product where its fused kernel can (x is A's input: no
  // dropout), and in float32 y += scale h B^T with it too.
  Nf4GemmSideProducts side;
  if (lora && xd.data() == x.data()) {
    side.rank = lora->a.extent(0);
    side.right = h.data();
    side.ldr = h.stride(0);
    side.v = lora->a.data();
    side.v_stride_k = 1;
    side.v_stride_j = lora->a.stride(0);
    if (!bf16 && side.rank <= kNf4GemmMaxAddedRank) {
      side.u = lora->b.data();
      side.u_stride_j = 1;
      side.u_stride_n = lora->b.stride(0);
      side.u_alpha = lora->scale;
    }
  }
  const bool h_done = linear_nf4_forward(exec, W, x, y, ws, 0.0f, impl::base_inputs(W, bf16),
                                         side.rank > 0 ? &side : nullptr);
  const bool out_done = h_done && side.u != nullptr;
  if (bias.data()) {
    add_bias(exec, bias, bf16, y);  // (rounds the sum once)
  } else if (bf16 && !lora) {
    round_bf16(exec, y);  // (with an adapter: rounded in its add below, one pass for all)
  }
  if (!lora || out_done) return;
  if (!h_done) gemm(exec, "N", "T", 1.0f, xd, lora->a, 0.0f, h);
  if (bf16) {
    round_bf16(exec, h);
    const Matrix<M> tmp(scratch.tmp.data(), y.extent(0), y.extent(1));
    gemm(exec, "N", "T", 1.0f, h, lora->b, 0.0f, tmp);
    // y = R(R(y) + R(scale * R(tmp))) (R(y) of a biased y is y: rounding is idempotent)
    add_scaled_bf16(exec, lora->scale, tmp, y, true);
  } else {
    gemm(exec, "N", "T", lora->scale, h, lora->b, 1.0f, y);
  }
}

/// The adapter's gradients (added into ga, gb when `accumulate`, else written) and, with
/// `gx` non-empty, gx = gy W + gx_beta * gx plus the adapter's share. `dropout` null: none
/// (xd is x).
template <class ExecSpace, class M>
void lora_projection_backward(const ExecSpace& exec, const Nf4Tensor<M>& W,
                              const LoraAdapterViews<M>* lora, const Matrix<M>& gy,
                              const Matrix<M>& xd, const Matrix<M>& h, bool accumulate,
                              const DropoutKey* dropout, bool bf16, LoraScratch<M>& scratch,
                              LinearNf4Workspace<M>& ws, float gx_beta, const Matrix<M>& gx) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const int64_t T = gy.extent(0);
  const GemmInputs inputs = impl::base_inputs(W, bf16);
  bool base_done = false, out_done = false;
  Matrix<M> gh;
  if (lora) {
    const float s = lora->scale;
    const int64_t r = lora->a.extent(0);
    gh = Matrix<M>(scratch.gh.data(), T, r);
    const Matrix<M> gbt = impl::lora_b_gradient_transposed(scratch, gy.extent(1), r);
    bool side_done = false;
    // gh = s gy B and dB^T = s h^T gy within the base product where it can, and in float32
    // without dropout gx += gh A with it too.
    if (gx.data()) {
      Nf4GemmSideProducts side;
      side.rank = r;
      side.right = gh.data();
      side.ldr = gh.stride(0);
      side.v = lora->b.data();
      side.v_stride_k = lora->b.stride(0);
      side.v_stride_j = 1;
      side.right_alpha = s;
      side.left = gbt.data();
      side.ldl = gbt.stride(0);
      side.h = h.data();
      side.ldh = h.stride(0);
      side.left_alpha = s;
      if (!bf16 && !dropout && r <= kNf4GemmMaxAddedRank) {
        side.u = lora->a.data();
        side.u_stride_j = lora->a.stride(0);
        side.u_stride_n = 1;
      }
      side_done = linear_nf4_backward(exec, W, gy, gx, ws, gx_beta, inputs, &side);
      base_done = true;
      out_done = side_done && side.u != nullptr;
    }
    if (!side_done) {
      gemm(exec, "T", "N", s, h, gy, 0.0f, gbt);       // dB^T = s h^T gy
      gemm(exec, "N", "N", s, gy, lora->b, 0.0f, gh);  // gh = s gy B
    }
    impl::lora_b_gradient_store(exec, gbt, beta, lora->gb);
    if (bf16) round_bf16(exec, gh);
    gemm(exec, "T", "N", 1.0f, gh, xd, beta, lora->ga);  // dA = gh^T x_d
  }
  if (!gx.data()) return;
  if (!base_done) linear_nf4_backward(exec, W, gy, gx, ws, gx_beta, inputs);
  if (lora && !out_done) {
    if (dropout || bf16) {
      const Matrix<M> tmp(scratch.tmp.data(), T, gx.extent(1));
      gemm(exec, "N", "N", 1.0f, gh, lora->a, 0.0f, tmp);  // gh A
      if (bf16 && !dropout) {
        add_rounded_bf16(exec, tmp, gx);  // gx = R(gx + R(gh A)), one pass
        return;
      }
      if (bf16) round_bf16(exec, tmp);
      dropout_apply(exec, *dropout, false, tmp, gx, 1.0f);
    } else {
      gemm(exec, "N", "N", 1.0f, gh, lora->a, 1.0f, gx);  // gx += gh A
    }
  }
  if (bf16) round_bf16(exec, gx);
}

}  // namespace kqlora
