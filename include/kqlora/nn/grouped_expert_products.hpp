#pragma once
// A sparse layer's products over its experts' grouped rows, every expert in one kernel
// launch (docs/MODELS.md, "Experts"): the rows of expert e are [offsets[e], offsets[e + 1])
// of a grouped matrix (nn/sparse_mlp.hpp), and each expert has its own matrix -- an NF4
// weight decoded element by element (torchao's bytes and rounding, quant/nf4_codebook.hpp),
// or a dense row-major slice (an adapter's A or B). On a GPU a loop over the experts would
// be a launch per expert and projection (thousands a step); these are one each.
//
//   grouped_product:   Y[n, :] = alpha X[n, :] W_e^T + beta Y[n, :]   (W_e [P, K])
//                      or, transposed, alpha X[n, :] W_e + beta Y[n, :] (W_e [K, P])
//   grouped_row_sums:  G_e = alpha A_e^T B_e + beta G_e over the expert's rows n
//                      (G expert-major [E * P, Q]: an adapter's gradient)
//
// Each team computes a tile of TR rows by TP columns, stepping through the summed index in
// chunks of TK held in team scratch; the tiles of every expert are listed on the host (the
// offsets live there) and run in one launch. Sums are float32, in a fixed order.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/blas.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/quant/nf4_codebook.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

/// One expert's matrix as the grouped kernels read it: NF4 (data, scalers, factor, mean) or
/// dense (a row-major float32 matrix with row stride ld).
struct ExpertMatrixRef {
  const uint8_t* data = nullptr;
  const int8_t* scalers = nullptr;
  const float* factor = nullptr;
  float mean = 0;
  float* dense = nullptr;  // (written only as grouped_row_sums' output)
  int64_t ld = 0;
};

/// Every expert's matrix of one projection: [rows, cols] each.
template <class M>
struct ExpertMatrices {
  Kokkos::View<ExpertMatrixRef*, M> refs;
  int64_t rows = 0, cols = 0;
  int64_t block_size = 64, scaler_block_size = 256;
  bool bf16_nf4 = false;  // NF4 of bfloat16 values (decoded with bfloat16 rounding)
};

/// The NF4 weights of E experts (each [rows, cols], one layout); the table copied on exec.
template <class ExecSpace, class M>
ExpertMatrices<M> nf4_expert_matrices(const ExecSpace& exec,
                                      const std::vector<const Nf4Tensor<M>*>& w) {
  KQLORA_CHECK(!w.empty(), "nf4_expert_matrices: no expert");
  ExpertMatrices<M> m;
  const Nf4Layout& l = w[0]->layout;
  m.rows = l.shape[0];
  m.cols = l.shape[1];
  m.block_size = l.block_size;
  m.scaler_block_size = l.scaler_block_size;
  m.bf16_nf4 = l.dtype == DType::bfloat16;
  m.refs = Kokkos::View<ExpertMatrixRef*, M>("kqlora::grouped::nf4_refs", w.size());
  auto h = Kokkos::create_mirror_view(Kokkos::HostSpace(), m.refs);
  for (size_t e = 0; e < w.size(); ++e) {
    KQLORA_CHECK(w[e]->layout == l, "nf4_expert_matrices: experts of different layouts");
    h(e).data = w[e]->quantized_data.data();
    h(e).scalers = w[e]->quantized_scalers.data();
    h(e).factor = w[e]->quantization_factor.data();
    h(e).mean = w[e]->scaler_mean;
  }
  Kokkos::deep_copy(exec, m.refs, h);
  fence(exec, "kqlora::grouped::nf4_refs");  // (h is freed on return)
  return m;
}

/// Dense per-expert matrices, each [rows, cols] with its own row stride (an adapter's A or
/// B slice of an expert, or its gradient's).
template <class ExecSpace, class M>
ExpertMatrices<M> dense_expert_matrices(const ExecSpace& exec,
                                        const std::vector<Matrix<M>>& per_expert) {
  KQLORA_CHECK(!per_expert.empty(), "dense_expert_matrices: no expert");
  ExpertMatrices<M> m;
  m.rows = per_expert[0].extent(0);
  m.cols = per_expert[0].extent(1);
  m.refs = Kokkos::View<ExpertMatrixRef*, M>("kqlora::grouped::dense_refs", per_expert.size());
  auto h = Kokkos::create_mirror_view(Kokkos::HostSpace(), m.refs);
  for (size_t e = 0; e < per_expert.size(); ++e) {
    KQLORA_CHECK(static_cast<int64_t>(per_expert[e].extent(0)) == m.rows &&
                     static_cast<int64_t>(per_expert[e].extent(1)) == m.cols,
                 "dense_expert_matrices: experts of different shapes");
    h(e).dense = per_expert[e].data();
    h(e).ld = static_cast<int64_t>(per_expert[e].stride(0));
  }
  Kokkos::deep_copy(exec, m.refs, h);
  fence(exec, "kqlora::grouped::dense_refs");  // (h is freed on return)
  return m;
}

/// The slices of an expert-major matrix [E * rows, cols] (expert e's rows e * rows on).
template <class ExecSpace, class M>
ExpertMatrices<M> dense_expert_matrices(const ExecSpace& exec, const Matrix<M>& all,
                                        int64_t experts) {
  const int64_t rows = all.extent(0) / experts;
  std::vector<Matrix<M>> per;
  for (int64_t e = 0; e < experts; ++e)
    per.emplace_back(all.data() + e * rows * static_cast<int64_t>(all.stride(0)), rows,
                     all.extent(1));
  return dense_expert_matrices(exec, per);
}

namespace impl {

constexpr int64_t kGroupedRows = 16, kGroupedCols = 64, kGroupedChunk = 32;

/// Element (r, c) of expert matrix w.
KOKKOS_INLINE_FUNCTION float expert_value(const ExpertMatrixRef& w, int64_t r, int64_t c,
                                          int64_t cols, int64_t bs, int64_t sbs, bool bf16,
                                          const Nf4Codebook& cb) {
  if (w.dense) return w.dense[r * w.ld + c];
  const int64_t i = r * cols + c, b = i / bs;
  const uint8_t byte = w.data[i / 2];
  const float v = cb.v[i % 2 == 0 ? byte >> 4 : byte & 15];
  if (bf16)
    return nf4_decode<bfloat16>(v,
                                nf4_block_scale<bfloat16>(w.scalers[b], w.factor[b / sbs], w.mean));
  return nf4_decode<float>(v, nf4_block_scale<float>(w.scalers[b], w.factor[b / sbs], w.mean));
}

/// A tile: expert e, rows [r0, r0 + kGroupedRows) of its group (clipped), columns p0 on.
struct GroupedTile {
  int32_t expert = 0;
  int64_t r0 = 0, r1 = 0, p0 = 0;
};

/// The tiles of every expert's rows and `cols` output columns (host).
inline std::vector<GroupedTile> grouped_tiles(const std::vector<int64_t>& offsets, int64_t cols,
                                              int64_t rows_per_tile) {
  std::vector<GroupedTile> t;
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    for (int64_t r0 = offsets[e]; r0 < offsets[e + 1]; r0 += rows_per_tile)
      for (int64_t p0 = 0; p0 < cols; p0 += kGroupedCols)
        t.push_back(
            {static_cast<int32_t>(e), r0, std::min(r0 + rows_per_tile, offsets[e + 1]), p0});
  return t;
}

template <class M, class ExecSpace>
Kokkos::View<GroupedTile*, M> device_tiles(const ExecSpace& exec,
                                           const std::vector<GroupedTile>& t) {
  Kokkos::View<GroupedTile*, M> d(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::grouped::tiles"), t.size());
  Kokkos::deep_copy(exec, d,
                    Kokkos::View<const GroupedTile*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        t.data(), t.size()));
  fence(exec, "kqlora::grouped::tiles");  // (t is the caller's temporary)
  return d;
}

}  // namespace impl

/// How grouped_product writes its sums S into Y: alpha S + beta Y; or, for a bfloat16 run's
/// adapter outputs (lora_projection.hpp's roundings, with no scratch of all the rows),
/// Y = R(R(Y) + R(alpha R(S))) (add_scaled) or Y = R(Y + R(S)) (add_rounded).
enum class GroupedEpilogue { plain, bf16_add_scaled, bf16_add_rounded };

/// Y rows of each expert's group = alpha X rows W_e^T (W_e [P, K]; `transposed`: alpha X
/// rows W_e, W_e [K, P]) + beta Y rows. X [N, K], Y [N, P]; `offsets` (host) E + 1.
template <class ExecSpace, class M>
void grouped_product(const ExecSpace& exec, const ExpertMatrices<M>& w, bool transposed,
                     const std::vector<int64_t>& offsets, float alpha, const Matrix<M>& x,
                     float beta, const Matrix<M>& y,
                     GroupedEpilogue epilogue = GroupedEpilogue::plain) {
  const int64_t P = transposed ? w.cols : w.rows, K = transposed ? w.rows : w.cols;
  KQLORA_CHECK(
      static_cast<int64_t>(x.extent(1)) == K && static_cast<int64_t>(y.extent(1)) == P &&
          x.extent(0) == y.extent(0) &&
          static_cast<int64_t>(w.refs.extent(0)) + 1 == static_cast<int64_t>(offsets.size()),
      "grouped_product: shapes");
  const auto tiles =
      impl::device_tiles<M>(exec, impl::grouped_tiles(offsets, P, impl::kGroupedRows));
  if (tiles.extent(0) == 0) return;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Team = typename Policy::member_type;
  using Scratch = Kokkos::View<float*, typename ExecSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  constexpr int64_t TR = impl::kGroupedRows, TP = impl::kGroupedCols, TK = impl::kGroupedChunk;
  const size_t scratch = Scratch::shmem_size(TR * TK + TP * TK + TR * TP);
  const auto refs = w.refs;
  const int64_t cols = w.cols, bs = w.block_size, sbs = w.scaler_block_size;
  const bool bf16 = w.bf16_nf4;
  const Nf4Codebook cb = bf16 ? Nf4Codebook::make<bfloat16>() : Nf4Codebook::make<float>();
  Kokkos::parallel_for(
      "kqlora::grouped_product",
      Policy(exec, static_cast<int>(tiles.extent(0)), Kokkos::AUTO)
          .set_scratch_size(0, Kokkos::PerTeam(scratch)),
      KOKKOS_LAMBDA(const Team& team) {
        const impl::GroupedTile t = tiles(team.league_rank());
        const ExpertMatrixRef W = refs(t.expert);
        const int64_t nr = t.r1 - t.r0, np = P - t.p0 < TP ? P - t.p0 : TP;
        Scratch xs(team.team_scratch(0), TR * TK), ws(team.team_scratch(0), TP * TK),
            acc(team.team_scratch(0), TR * TP);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TR * TP),
                             [&](int64_t i) { acc(i) = 0.0f; });
        for (int64_t k0 = 0; k0 < K; k0 += TK) {
          const int64_t nk = K - k0 < TK ? K - k0 : TK;
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TR * TK), [&](int64_t i) {
            const int64_t r = i / TK, k = i % TK;
            xs(i) = r < nr && k < nk ? x(t.r0 + r, k0 + k) : 0.0f;
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TP * TK), [&](int64_t i) {
            const int64_t p = i / TK, k = i % TK;
            float v = 0.0f;
            if (p < np && k < nk)
              v = transposed ? impl::expert_value(W, k0 + k, t.p0 + p, cols, bs, sbs, bf16, cb)
                             : impl::expert_value(W, t.p0 + p, k0 + k, cols, bs, sbs, bf16, cb);
            ws(i) = v;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TR * TP), [&](int64_t i) {
            const int64_t r = i / TP, p = i % TP;
            float s = 0.0f;
            for (int64_t k = 0; k < TK; ++k) s += xs(r * TK + k) * ws(p * TK + k);
            acc(i) += s;
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TR * TP), [&](int64_t i) {
          const int64_t r = i / TP, p = i % TP;
          if (r >= nr || p >= np) return;
          float& out = y(t.r0 + r, t.p0 + p);
          if (epilogue == GroupedEpilogue::bf16_add_scaled)
            out = round_to_bf16(round_to_bf16(out) + round_to_bf16(alpha * round_to_bf16(acc(i))));
          else if (epilogue == GroupedEpilogue::bf16_add_rounded)
            out = round_to_bf16(out + round_to_bf16(acc(i)));
          else
            out = beta == 0.0f ? alpha * acc(i) : alpha * acc(i) + beta * out;
        });
      });
}

/// G_e = alpha A_e^T B_e + beta G_e for every expert e, A_e and B_e the expert's rows of
/// A [N, P] and B [N, Q], G_e [P, Q] expert e's dense matrix of g (an adapter's gradient; an
/// expert no row chose gets beta G_e).
template <class ExecSpace, class M>
void grouped_row_sums(const ExecSpace& exec, const std::vector<int64_t>& offsets, float alpha,
                      const Matrix<M>& a, const Matrix<M>& b, float beta,
                      const ExpertMatrices<M>& g) {
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1, P = a.extent(1), Q = b.extent(1);
  KQLORA_CHECK(a.extent(0) == b.extent(0) && g.rows == P && g.cols == Q &&
                   static_cast<int64_t>(g.refs.extent(0)) == E,
               "grouped_row_sums: shapes");
  // Tiles of each expert's [P, Q] output (GroupedTile's rows [r0, r1) of P, columns p0 of
  // Q on), each summing every row of the expert's group.
  std::vector<impl::GroupedTile> host;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p0 = 0; p0 < P; p0 += impl::kGroupedRows)
      for (int64_t q0 = 0; q0 < Q; q0 += impl::kGroupedCols)
        host.push_back({static_cast<int32_t>(e), p0, std::min(p0 + impl::kGroupedRows, P), q0});
  const auto tiles = impl::device_tiles<M>(exec, host);
  if (tiles.extent(0) == 0) return;
  Kokkos::View<int64_t*, M> offs("kqlora::grouped::offsets", offsets.size());
  Kokkos::deep_copy(exec, offs,
                    Kokkos::View<const int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        offsets.data(), offsets.size()));
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Team = typename Policy::member_type;
  constexpr int64_t TR = impl::kGroupedRows, TQ = impl::kGroupedCols;
  const auto refs = g.refs;
  Kokkos::parallel_for(
      "kqlora::grouped_row_sums", Policy(exec, static_cast<int>(tiles.extent(0)), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const impl::GroupedTile t = tiles(team.league_rank());
        const int64_t n0 = offs(t.expert), n1 = offs(t.expert + 1);
        const int64_t np = t.r1 - t.r0, nq = Q - t.p0 < TQ ? Q - t.p0 : TQ;
        const ExpertMatrixRef G = refs(t.expert);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, TR * TQ), [&](int64_t i) {
          const int64_t p = i / TQ, q = i % TQ;
          if (p >= np || q >= nq) return;
          float s = 0.0f;
          for (int64_t n = n0; n < n1; ++n) s += a(n, t.r0 + p) * b(n, t.p0 + q);
          float& out = G.dense[(t.r0 + p) * G.ld + t.p0 + q];
          out = beta == 0.0f ? alpha * s : alpha * s + beta * out;
        });
      });
  fence(exec, "kqlora::grouped_row_sums");  // (offs is freed on return)
}

}  // namespace kqlora
