#pragma once
// A fused projection's output split into its slots, and their gradients gathered back:
// columns [col0, col0 + dst.extent(1)) of a [tokens, fused] matrix (Phi-3's qkv_proj =
// [q | k | v], gate_up_proj = [gate | up]); or, a grouped projection (Qwen3-Next's
// in_proj_qkvz: per key head group [q_h | k_h | v_h | z_h]), each piece's share of every
// group.

#include <Kokkos_Core.hpp>

#include "kqlora/nn/elementwise.hpp"

namespace kqlora {

/// dst = src[:, col0 : col0 + width].
template <class ExecSpace, class M>
void take_columns(const ExecSpace& exec, const Matrix<M>& src, int64_t col0, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::take_columns", over(exec, dst.extent(0), dst.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) { dst(t, f) = src(t, col0 + f); });
}

/// dst[:, col0 : col0 + width] = src.
template <class ExecSpace, class M>
void put_columns(const ExecSpace& exec, const Matrix<M>& src, int64_t col0, const Matrix<M>& dst) {
  Kokkos::parallel_for(
      "kqlora::put_columns", over(exec, src.extent(0), src.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) { dst(t, col0 + f) = src(t, f); });
}

/// A grouped layout: src holds `groups` groups of `group_width` columns; columns
/// [off, off + width / groups) of group g are dst[:, col0 + g * width / groups + j].
struct GroupedPiece {
  int64_t groups, group_width, off, col0, width;
};

/// dst's piece = its share of each of src's groups.
template <class ExecSpace, class M>
void take_grouped_columns(const ExecSpace& exec, const Matrix<M>& src, const GroupedPiece& p,
                          const Matrix<M>& dst) {
  const int64_t per = p.width / p.groups, gw = p.group_width, off = p.off, col0 = p.col0;
  Kokkos::parallel_for(
      "kqlora::take_grouped_columns", over(exec, dst.extent(0), p.width),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        dst(t, col0 + f) = src(t, (f / per) * gw + off + f % per);
      });
}

/// The inverse: the piece's columns of dst written into src's groups.
template <class ExecSpace, class M>
void put_grouped_columns(const ExecSpace& exec, const Matrix<M>& piece, const GroupedPiece& p,
                         const Matrix<M>& fused) {
  const int64_t per = p.width / p.groups, gw = p.group_width, off = p.off, col0 = p.col0;
  Kokkos::parallel_for(
      "kqlora::put_grouped_columns", over(exec, piece.extent(0), p.width),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        fused(t, (f / per) * gw + off + f % per) = piece(t, col0 + f);
      });
}

}  // namespace kqlora
