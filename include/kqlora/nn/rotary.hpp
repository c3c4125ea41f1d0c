#pragma once
// Rotary position embeddings in Hugging Face's rotate-half convention, in place on the
// [tokens, heads * head_dim] queries or keys (tokens row-major over [sequences, S], each
// sequence at positions 0 .. S-1, or a packed row's position_ids): with half = rotary_dim / 2 (the
// table's width; rotary_dim = head_dim unless partial), for each head and i < half, the pair (a, b)
// = (x[i], x[i + half]) becomes
//   a' = a cos - b sin,   b' = b cos + a sin,
// with cos and sin of position * inv_freq_i (times an attention factor: longrope); the
// dims from rotary_dim on pass through. The backward is the transposed rotation (the same
// with sin negated). No permutation of the q / k weights is involved.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <vector>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

/// cos and sin [S, rotary_dim / 2] of position * inv_freq (times `factor`), computed in
/// float32 as transformers does (rounded to bfloat16 when `bf16`: it casts them to the
/// activations' dtype).
template <class M>
struct RopeTable {
  Matrix<M> cos, sin;

  RopeTable() = default;
  /// Built on the host, copied on `exec` (the model's instance: no device-wide sync).
  template <class ExecSpace>
  RopeTable(const ExecSpace& exec, const std::vector<float>& inv_freq, int64_t S, bool bf16,
            float factor = 1.0f) {
    const int64_t half = static_cast<int64_t>(inv_freq.size());
    cos = Matrix<M>("kqlora::rope::cos", S, half);
    sin = Matrix<M>("kqlora::rope::sin", S, half);
    auto hc = Kokkos::create_mirror_view(cos);
    auto hs = Kokkos::create_mirror_view(sin);
    for (int64_t p = 0; p < S; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(p) * inv_freq[i];
        float co = std::cos(angle), si = std::sin(angle);
        if (factor != 1.0f) co *= factor, si *= factor;
        hc(p, i) = bf16 ? round_to_bf16(co) : co;
        hs(p, i) = bf16 ? round_to_bf16(si) : si;
      }
    Kokkos::deep_copy(exec, cos, hc);
    Kokkos::deep_copy(exec, sin, hs);
    fence(exec, "kqlora::rope::table");  // (hc and hs are freed on return)
  }
  RopeTable(const std::vector<float>& inv_freq, int64_t S, bool bf16, float factor = 1.0f)
      : RopeTable(typename M::execution_space(), inv_freq, S, bf16, factor) {}
  int64_t positions() const { return cos.extent(0); }
};

/// Per token of [sequences, S]: its position (a packed row's position_ids; int32).
template <class M>
using TokenPositions = Kokkos::View<const int32_t**, Kokkos::LayoutRight, M>;

namespace impl {

/// A team per token row, the heads in turn, each head's pairs by row_for: on the host a
/// plain loop over contiguous pairs that vectorises (the 2-D range's divisions per element
/// kept the pass scalar, 1.7% of the 135M step).
template <bool BF16, class ExecSpace, class M>
void rope_rows(const ExecSpace& exec, const RopeTable<M>& rope, int64_t S, int64_t head_dim,
               float sign, const Matrix<M>& x, const TokenPositions<M>& positions) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  const int64_t half = rope.cos.extent(1), heads = x.extent(1) / head_dim;
  const auto c = rope.cos, s = rope.sin;
  const bool given = positions.data() != nullptr;
  Kokkos::parallel_for(
      "kqlora::rope_apply",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(x.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t t = team.league_rank();
        const int64_t p = given ? positions(t / S, t % S) : t % S;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t ia = h * head_dim, ib = ia + half;
          row_for(team, 0, half, [&](int64_t i) {
            const float a = x(t, ia + i), b = x(t, ib + i), co = c(p, i), si = sign * s(p, i);
            if (BF16) {  // PyTorch: x * cos + rotate_half(x) * sin, each product rounded
              x(t, ia + i) = round_to_bf16(round_to_bf16(a * co) + round_to_bf16(-b * si));
              x(t, ib + i) = round_to_bf16(round_to_bf16(b * co) + round_to_bf16(a * si));
            } else {
              x(t, ia + i) = a * co - b * si;
              x(t, ib + i) = b * co + a * si;
            }
          });
        }
      });
}

}  // namespace impl

/// Rotates x in place; `backward`: applies the transpose (x holds a gradient). S is the
/// sequence length (x's rows are sequences of S tokens); the table's width is half the
/// rotated dims of each head. `positions` (packed rows; each below the table's
/// positions()): each token's position, else its place in its sequence.
template <class ExecSpace, class M>
void rope_apply(const ExecSpace& exec, const RopeTable<M>& rope, int64_t S, int64_t head_dim,
                bool backward, bool bf16, const Matrix<M>& x,
                const TokenPositions<M>& positions = TokenPositions<M>()) {
  const float sign = backward ? -1.0f : 1.0f;
  if (bf16)
    impl::rope_rows<true>(exec, rope, S, head_dim, sign, x, positions);
  else
    impl::rope_rows<false>(exec, rope, S, head_dim, sign, x, positions);
}

}  // namespace kqlora
