#pragma once
// y = x W^T with W an NF4 tensor [out, in], and its input gradient gx = gy W (W is frozen).
// Two ways, neither of which holds a float copy of all of W at any time:
// - fused (host, AVX-512 builds): W decoded straight into the GEMM's cache-sized panels
//   (quant/nf4_gemm.hpp); no float copy of W reaches memory.
// - panels (every space): W dequantized in row panels into a float32 scratch buffer
//   (bfloat16 NF4 widens into float32 panels), each panel consumed by a gemm at once. A
//   panel of W's rows is a row-major [P, in] matrix W_p; activations are row-major
//   [tokens, features], so the panel's outputs are a column block of y, which the host
//   BLAS reads and writes in place (leading dimension out).
// docs/BENCHMARKS.md ("The fused NF4 GEMM") has the numbers behind the choice.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
#include <type_traits>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/quant/nf4_gemm.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace kqlora {

/// How linear_nf4_* multiply by W. automatic: fused where this build and W's layout have
/// it, the call has at most kFusedMaxTokens tokens and the host BLAS runs no more threads
/// than Kokkos's host space; panels otherwise.
enum class Nf4Product { automatic, panels, fused };

/// Above this many tokens the BLAS's own kernel, fed dequantized panels, is as fast or
/// faster than the fused one (its decode and packing are then a small share of the product):
/// measured side by side on AVX-512 Xeons, docs/BENCHMARKS.md ("The fused NF4 GEMM"; 1024
/// since the fused kernel prefetches its activations: "Speed (issue 25, continued),
/// 2026-12-04, fifth session").
constexpr int64_t kFusedMaxTokens = 1024;

/// Scratch for the dequantized panels (or the fused kernel's packed activations); one per
/// model, reused by every layer and call.
template <class MemSpace>
struct LinearNf4Workspace {
  Kokkos::View<float*, MemSpace> panel;
  /// The panel of a bfloat16 NF4 weight in 16 bits, for the host's bfloat16 products.
  Kokkos::View<bfloat16*, MemSpace> panel16;
  /// Called after each panel's gemm (the fused kernel: after each block of the summed
  /// index), e.g. to drive outstanding communication.
  std::function<void()> between_panels;
  /// > 0: panels of at most this many bytes (tests: several panels on a small weight).
  int64_t max_panel_bytes = 0;
  /// The way to multiply (tests and benchmarks set it; `fused` needs the fused kernel).
  Nf4Product product = Nf4Product::automatic;

  /// Rows per panel for a call over `tokens` tokens (whole NF4 blocks each), the buffer
  /// grown to hold them. A panel of at least 4 MiB (256 rows of a 4096-wide weight) stays
  /// in the L3 cache between its dequantization and the gemm that reads it; the forward's
  /// gemm packs the whole input once per panel, so a panel also holds at least twice the
  /// input's bytes (at 2048 tokens of 4096 features: the whole weight). Measured on an AMD
  /// EPYC Zen 3 (OpenBLAS Zen kernel, interleaved pairs against the dense linear,
  /// docs/BENCHMARKS.md): 2048 tokens 1.117x with 4 MiB panels, 1.003x with the whole
  /// weight; 256 tokens 1.046 - 1.055x at 4 - 64 MiB.
  int64_t reserve(int64_t out_features, int64_t in_features, int64_t block_size, int64_t tokens) {
    int64_t target_bytes = std::max(int64_t(4) << 20, 2 * 4 * tokens * in_features);
    const int64_t rows = panel_rows(out_features, in_features, block_size, target_bytes, 4);
    if (rows * in_features > static_cast<int64_t>(panel.extent(0))) {
      panel = Kokkos::View<float*, MemSpace>();  // (the old one goes first)
      panel = Kokkos::View<float*, MemSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::LinearNf4::panel"),
          rows * in_features);
    }
    return rows;
  }

  /// Rows per 16-bit panel (the bfloat16 products), panel16 grown to hold them: 4 MiB whatever
  /// the tokens, so that the input gradient's sum over the panels has the same order at
  /// any token count.
  int64_t reserve16(int64_t out_features, int64_t in_features, int64_t block_size) {
    const int64_t rows = panel_rows(out_features, in_features, block_size, int64_t(4) << 20, 2);
    if (rows * in_features > static_cast<int64_t>(panel16.extent(0))) {
      panel16 = Kokkos::View<bfloat16*, MemSpace>();
      panel16 = Kokkos::View<bfloat16*, MemSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::LinearNf4::panel16"),
          rows * in_features);
    }
    return rows;
  }

 private:
  /// Rows of `target_bytes` at most (max_panel_bytes too), whole NF4 blocks each.
  int64_t panel_rows(int64_t out_features, int64_t in_features, int64_t block_size,
                     int64_t target_bytes, int64_t bytes_per_value) const {
    if (max_panel_bytes > 0) target_bytes = std::min(target_bytes, max_panel_bytes);
    // Rows per panel must make rows * in_features a multiple of block_size.
    const int64_t step = block_size / std::gcd(block_size, in_features);
    const int64_t rows =
        std::max<int64_t>(step, target_bytes / (bytes_per_value * in_features) / step * step);
    return std::min(rows, (out_features + step - 1) / step * step);
  }
};

namespace impl {

/// Whether a product goes to the host's bfloat16 hardware (host_bf16_products()): a bfloat16 NF4
/// weight times bfloat16 values, W decoded in 16-bit row panels (for_each_panel16).
template <class ExecSpace, class MemSpace>
bool bf16_unit_panels(const Nf4Tensor<MemSpace>& W, GemmInputs inputs) {
  return std::is_same<MemSpace, Kokkos::HostSpace>::value &&
         std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value &&
         inputs == GemmInputs::bfloat16 && W.layout.dtype == DType::bfloat16 &&
         host_bf16_products();
}

/// The product through the fused host kernel, when it applies: c = a op(W) + beta c, and
/// `side`'s products of a when set and the host space runs one thread (they run on the
/// calling thread; *side_done says whether they were).
template <class ExecSpace, class MemSpace>
bool fused_nf4_gemm(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W, Nf4GemmOp op,
                    const Matrix<MemSpace>& a, float beta, const Matrix<MemSpace>& c,
                    LinearNf4Workspace<MemSpace>& ws, GemmInputs inputs,
                    const Nf4GemmSideProducts* side, bool* side_done) {
  *side_done = false;
  if constexpr (std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value &&
                std::is_same<MemSpace, Kokkos::HostSpace>::value) {
    if (ws.product == Nf4Product::panels) return false;
    if (!nf4_gemm_host_supports(W.layout)) {
      KQLORA_CHECK(ws.product != Nf4Product::fused,
                   "linear_nf4: no fused kernel for " << W.layout.shape_string());
      return false;
    }
    // A multithreaded BLAS would outrun a one-thread Kokkos host space, and bfloat16 hardware
    // multiplying bfloat16 panels the fused kernel's float32 FMAs.
    if (ws.product == Nf4Product::automatic &&
        (static_cast<int64_t>(a.extent(0)) > kFusedMaxTokens ||
         blas_threads() > exec.concurrency() || bf16_unit_panels<ExecSpace>(W, inputs)))
      return false;
    if (exec.concurrency() != 1 || a.extent(0) == 0) side = nullptr;  // (none to compute)
    nf4_gemm_host(exec, W, op, a.extent(0), a.data(), a.stride(0), beta, c.data(), c.stride(0),
                  ws.panel, ws.between_panels, side);
    *side_done = side != nullptr;
    return true;
  } else {
    (void)inputs;
    (void)side;
    KQLORA_CHECK(ws.product != Nf4Product::fused, "linear_nf4: no fused kernel off the host");
    return false;
  }
}

/// Calls f(row0, rows, Wp) for each row panel of W, Wp the [rows, in] dequantized panel.
template <class ExecSpace, class MemSpace, class F>
void for_each_panel(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W, int64_t tokens,
                    LinearNf4Workspace<MemSpace>& ws, F&& f) {
  const int64_t out = W.layout.shape[0], in = W.layout.shape[1], bs = W.layout.block_size;
  const int64_t panel_rows = ws.reserve(out, in, bs, tokens);
  for (int64_t r0 = 0; r0 < out; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, out - r0);
    // rows * in is a whole number of blocks except possibly for the last panel, whose end
    // is the tensor's end (numel is a multiple of block_size).
    nf4_dequantize_blocks(exec, W, r0 * in / bs, rows * in / bs, ws.panel, Nf4Store::cached);
    f(r0, rows, Matrix<MemSpace>(ws.panel.data(), rows, in));
    if (ws.between_panels) ws.between_panels();
  }
}

/// Calls f(row0, rows, Wp) for each 16-bit row panel of W, Wp its [rows, in] bits.
template <class ExecSpace, class MemSpace, class F>
void for_each_panel16(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                      LinearNf4Workspace<MemSpace>& ws, F&& f) {
  const int64_t out = W.layout.shape[0], in = W.layout.shape[1], bs = W.layout.block_size;
  const int64_t panel_rows = ws.reserve16(out, in, bs);
  for (int64_t r0 = 0; r0 < out; r0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, out - r0);
    nf4_dequantize_blocks(exec, W, r0 * in / bs, rows * in / bs, ws.panel16, Nf4Store::cached);
    f(r0, rows, reinterpret_cast<const uint16_t*>(ws.panel16.data()));
    if (ws.between_panels) ws.between_panels();
  }
}

}  // namespace impl

/// y = x W^T + beta * y; x [T, in], y [T, out]. `inputs` = bfloat16: x holds bfloat16
/// values and W is a bfloat16 NF4 tensor (a GPU may use its bfloat16 tensor cores, exactly;
/// core/blas.hpp). `side`: products of x to compute with it where the fused kernel can
/// (quant/nf4_gemm.hpp); returns whether they were computed.
template <class ExecSpace, class MemSpace>
bool linear_nf4_forward(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                        const Matrix<MemSpace>& x, const Matrix<MemSpace>& y,
                        LinearNf4Workspace<MemSpace>& ws, float beta = 0.0f,
                        GemmInputs inputs = GemmInputs::float32,
                        const Nf4GemmSideProducts* side = nullptr) {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "memory not accessible from exec");
  KQLORA_CHECK(!(W.layout.shape.size() != 2 || x.extent(1) != size_t(W.layout.shape[1]) ||
                 y.extent(1) != size_t(W.layout.shape[0]) || x.extent(0) != y.extent(0)),
               "linear_nf4_forward: shapes x " << x.extent(0) << "x" << x.extent(1) << ", y "
                                               << y.extent(0) << "x" << y.extent(1) << ", W "
                                               << W.layout.shape_string());
  bool side_done = false;
  if (impl::fused_nf4_gemm(exec, W, Nf4GemmOp::forward, x, beta, y, ws, inputs, side, &side_done))
    return side_done;
  const int64_t out = W.layout.shape[0], in = W.layout.shape[1];
  if (impl::bf16_unit_panels<ExecSpace>(W, inputs) && ws.product != Nf4Product::panels) {
    impl::for_each_panel16(exec, W, ws, [&](int64_t r0, int64_t rows, const uint16_t* Wp) {
      gemm_bf16_weight("N", "T", 1.0f, x, Wp, rows, in, in, beta,
                       Kokkos::subview(y, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows)));
    });
    return false;
  }
  impl::for_each_panel(
      exec, W, x.extent(0), ws, [&](int64_t r0, int64_t rows, const Matrix<MemSpace>& Wp) {
        if (rows == out)  // one panel: y itself (a plain row-major matrix for any gemm)
          gemm(exec, "N", "T", 1.0f, x, Wp, beta, y, inputs);
        else
          gemm(exec, "N", "T", 1.0f, x, Wp, beta,
               Kokkos::subview(y, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows)), inputs);
      });
  return false;
}

/// gx = gy W + beta * gx; gy [T, out], gx [T, in]. `inputs`: as the forward's (gy bfloat16).
/// `side`: products of gy, as the forward's of x.
template <class ExecSpace, class MemSpace>
bool linear_nf4_backward(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                         const Matrix<MemSpace>& gy, const Matrix<MemSpace>& gx,
                         LinearNf4Workspace<MemSpace>& ws, float beta = 0.0f,
                         GemmInputs inputs = GemmInputs::float32,
                         const Nf4GemmSideProducts* side = nullptr) {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "memory not accessible from exec");
  KQLORA_CHECK(!(W.layout.shape.size() != 2 || gx.extent(1) != size_t(W.layout.shape[1]) ||
                 gy.extent(1) != size_t(W.layout.shape[0]) || gx.extent(0) != gy.extent(0)),
               "linear_nf4_backward: shapes gy " << gy.extent(0) << "x" << gy.extent(1) << ", gx "
                                                 << gx.extent(0) << "x" << gx.extent(1) << ", W "
                                                 << W.layout.shape_string());
  bool side_done = false;
  if (impl::fused_nf4_gemm(exec, W, Nf4GemmOp::input_gradient, gy, beta, gx, ws, inputs, side,
                           &side_done))
    return side_done;
  const int64_t out = W.layout.shape[0], in = W.layout.shape[1];
  if (impl::bf16_unit_panels<ExecSpace>(W, inputs) && ws.product != Nf4Product::panels) {
    impl::for_each_panel16(exec, W, ws, [&](int64_t r0, int64_t rows, const uint16_t* Wp) {
      gemm_bf16_weight("N", "N", 1.0f,
                       Kokkos::subview(gy, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows)), Wp, rows,
                       in, in, r0 == 0 ? beta : 1.0f, gx);
    });
    return false;
  }
  impl::for_each_panel(exec, W, gy.extent(0), ws,
                       [&](int64_t r0, int64_t rows, const Matrix<MemSpace>& Wp) {
                         const float b = r0 == 0 ? beta : 1.0f;
                         if (rows == out)
                           gemm(exec, "N", "N", 1.0f, gy, Wp, b, gx, inputs);
                         else
                           gemm(exec, "N", "N", 1.0f,
                                Kokkos::subview(gy, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows)),
                                Wp, b, gx, inputs);
                       });
  return false;
}

}  // namespace kqlora
