#pragma once
// y = x W^T with W an NF4 tensor [out, in], and its input gradient gx = gy W (W is frozen).
// W is dequantized in row panels into a float32 scratch buffer (bfloat16 NF4 widens into
// float32 panels), each panel consumed by a Kokkos Kernels gemm at once; no full copy of W
// exists at any time. Activations are LayoutLeft [tokens, features], so a panel of W's rows
// is a contiguous column block of y and every gemm operand is a plain LayoutLeft matrix
// (a row-major [P, in] panel is the LayoutLeft [in, P] matrix W_p^T).

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <functional>
#include <numeric>

#include "kqlora/core/blas.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace kqlora {

/// Scratch for the dequantized panels; one per model, reused by every layer and call.
template <class MemSpace>
struct LinearNf4Workspace {
  Kokkos::View<float*, MemSpace> panel;
  int64_t panel_rows = 0;
  /// Called after each panel's gemm, e.g. to drive outstanding communication.
  std::function<void()> between_panels;

  /// Panels of about `target_bytes`, whole NF4 blocks each. 4 MiB (256 rows of a
  /// 4096-wide weight): the panel stays in the L3 cache between its dequantization and the
  /// gemm that reads it. Measured on an AMD EPYC Zen 3 (OpenBLAS Zen kernel, interleaved
  /// pairs, docs/BENCHMARKS.md): 1.020-1.027x of the dense linear at 256 tokens against
  /// 1.046-1.075x with 16 MiB panels, and no loss at 2048 tokens (0.994x vs 1.005x).
  void reserve(int64_t out_features, int64_t in_features, int64_t block_size,
               int64_t target_bytes = int64_t(4) << 20) {
    // Rows per panel must make rows * in_features a multiple of block_size.
    const int64_t step = block_size / std::gcd(block_size, in_features);
    int64_t rows = std::max<int64_t>(step, target_bytes / (4 * in_features) / step * step);
    rows = std::min(rows, (out_features + step - 1) / step * step);
    if (rows * in_features > static_cast<int64_t>(panel.extent(0))) {
      panel = Kokkos::View<float*, MemSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::LinearNf4::panel"),
          rows * in_features);
    }
    panel_rows = std::max(panel_rows, rows);
  }
};

namespace impl {

/// Calls f(row0, rows, WpT) for each row panel of W, WpT the LayoutLeft [in, rows] view
/// of the dequantized panel.
template <class ExecSpace, class MemSpace, class F>
void for_each_panel(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                    LinearNf4Workspace<MemSpace>& ws, F&& f) {
  const int64_t out = W.layout.shape[0], in = W.layout.shape[1], bs = W.layout.block_size;
  ws.reserve(out, in, bs);
  for (int64_t r0 = 0; r0 < out; r0 += ws.panel_rows) {
    const int64_t rows = std::min(ws.panel_rows, out - r0);
    // rows * in is a whole number of blocks except possibly for the last panel, whose end
    // is the tensor's end (numel is a multiple of block_size).
    nf4_dequantize_blocks(exec, W, r0 * in / bs, rows * in / bs, ws.panel, Nf4Store::cached);
    f(r0, rows, Matrix<MemSpace>(ws.panel.data(), in, rows));
    if (ws.between_panels) ws.between_panels();
  }
}

}  // namespace impl

/// y = x W^T + beta * y; x [T, in], y [T, out].
template <class ExecSpace, class MemSpace>
void linear_nf4_forward(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                        const Matrix<MemSpace>& x, const Matrix<MemSpace>& y,
                        LinearNf4Workspace<MemSpace>& ws, float beta = 0.0f) {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "memory not accessible from exec");
  KQLORA_THROW_IF(W.layout.shape.size() != 2 || x.extent(1) != size_t(W.layout.shape[1]) ||
                      y.extent(1) != size_t(W.layout.shape[0]) || x.extent(0) != y.extent(0),
                  "linear_nf4_forward: shapes x " << x.extent(0) << "x" << x.extent(1) << ", y "
                                                  << y.extent(0) << "x" << y.extent(1) << ", W "
                                                  << W.layout.shape_string());
  impl::for_each_panel(exec, W, ws, [&](int64_t r0, int64_t rows, const Matrix<MemSpace>& WpT) {
    auto yp = Kokkos::subview(y, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows));
    gemm(exec, "N", "N", 1.0f, x, WpT, beta, yp);
  });
}

/// gx = gy W + beta * gx; gy [T, out], gx [T, in].
template <class ExecSpace, class MemSpace>
void linear_nf4_backward(const ExecSpace& exec, const Nf4Tensor<MemSpace>& W,
                         const Matrix<MemSpace>& gy, const Matrix<MemSpace>& gx,
                         LinearNf4Workspace<MemSpace>& ws, float beta = 0.0f) {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "memory not accessible from exec");
  KQLORA_THROW_IF(W.layout.shape.size() != 2 || gx.extent(1) != size_t(W.layout.shape[1]) ||
                      gy.extent(1) != size_t(W.layout.shape[0]) || gx.extent(0) != gy.extent(0),
                  "linear_nf4_backward: shapes gy "
                      << gy.extent(0) << "x" << gy.extent(1) << ", gx " << gx.extent(0) << "x"
                      << gx.extent(1) << ", W " << W.layout.shape_string());
  impl::for_each_panel(exec, W, ws, [&](int64_t r0, int64_t rows, const Matrix<MemSpace>& WpT) {
    auto gyp = Kokkos::subview(gy, Kokkos::ALL, Kokkos::make_pair(r0, r0 + rows));
    gemm(exec, "N", "T", 1.0f, gyp, WpT, r0 == 0 ? beta : 1.0f, gx);
  });
}

}  // namespace kqlora
