#pragma once
// The gated delta rule of Gated DeltaNet layers (Qwen3.5, Qwen3-Next; docs/MODELS.md,
// "Gated DeltaNet"), forward and backward, in float32 whatever the run's dtype. Per value
// head h (reading key head h / (value_heads / key_heads)), over the tokens t of one
// document, with q_t, k_t its query and key (already L2-normalised, q scaled by dk^-1/2),
// v_t its value, beta_t in (0, 1) and the log decay g_t <= 0, the state S (dk x dv, zero at
// the document's start) follows
//   S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,   o_t = S_t^T q_t.
// It is computed as transformers' torch_chunk_gated_delta_rule plans it: chunks of 64 tokens
// from the document's start, the state carried from chunk to chunk; within a chunk of n
// tokens, with G_i = g_1 + ... + g_i and Gamma_ij = exp(G_i - G_j) (j <= i),
//   A  = strictly lower part of diag(beta) (K K^T) . Gamma,   T = (I + A)^-1
//   U  = T diag(beta) V,   W = T diag(beta exp(G)) K,   Vn = U - W S0
//   O  = diag(exp(G)) Q S0 + ((Q K^T) . Gamma) Vn        (lower part, diagonal included)
//   S1 = exp(G_n) S0 + (diag(exp(G_n - G)) K)^T Vn
// The forward keeps each chunk's S0 (`states`); the backward recomputes a chunk's terms from
// it and its inputs, and carries dS from the last chunk to the first. Cost: linear in the
// document's length (a chunk's work is O(64^2 (dk + dv) + 64 dk dv)).
//
// Each team is one (document, value head); its chunks run in order, a chunk's products
// spread over the team's threads (one thread on a host). Packed rows: a document restarts
// the state (transformers' torch path does not see documents; kqlora does).

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/nn/row_loops.hpp"

namespace kqlora {

/// The heads and their sizes.
struct DeltaRuleShape {
  int64_t key_heads = 0, value_heads = 0, dk = 0, dv = 0;
  static constexpr int64_t kChunk = 64;

  KOKKOS_INLINE_FUNCTION int64_t key_of(int64_t h) const { return h / (value_heads / key_heads); }
};

/// The documents of a batch as token ranges of its [tokens] rows, and where each one's
/// chunks start in the list of chunk states.
template <class M>
struct DeltaRuleDocuments {
  Kokkos::View<int64_t*, M> first, length, chunk0;
  int64_t count = 0, chunks = 0;
};

/// The documents of n rows of S tokens: each row one document, or, with `host_doc_start`
/// (per token, the row index of its document's first token: t - position), a document
/// from each token that starts one.
template <class ExecSpace>
DeltaRuleDocuments<typename ExecSpace::memory_space> delta_rule_documents(
    const ExecSpace& exec, int64_t n, int64_t S, const int32_t* host_doc_start) {
  using M = typename ExecSpace::memory_space;
  std::vector<int64_t> first, length, chunk0;
  int64_t chunks = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < S;) {
      int64_t end = t + 1;
      if (host_doc_start)
        while (end < S && host_doc_start[r * S + end] != end) ++end;
      else
        end = S;
      first.push_back(r * S + t);
      length.push_back(end - t);
      chunk0.push_back(chunks);
      chunks += (end - t + DeltaRuleShape::kChunk - 1) / DeltaRuleShape::kChunk;
      t = end;
    }
  DeltaRuleDocuments<M> d;
  d.count = static_cast<int64_t>(first.size());
  d.chunks = chunks;
  const auto to_device = [&](const std::vector<int64_t>& v, const char* name) {
    Kokkos::View<int64_t*, M> out(std::string(name), static_cast<int64_t>(v.size()));
    Kokkos::deep_copy(
        exec, out,
        Kokkos::View<const int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
            v.data(), v.size()));
    return out;
  };
  d.first = to_device(first, "kqlora::delta_rule::first");
  d.length = to_device(length, "kqlora::delta_rule::length");
  d.chunk0 = to_device(chunk0, "kqlora::delta_rule::chunk0");
  fence(exec, "kqlora::delta_rule_documents");  // (the host vectors go out of scope)
  return d;
}

/// The kernels' inputs: views of const floats (M deduced from the documents).
template <class M>
struct DeltaRuleInputOf {
  using type = Kokkos::View<const float**, Kokkos::LayoutRight, M>;
};
template <class M>
using DeltaRuleInput = typename DeltaRuleInputOf<M>::type;
template <class M>
struct DeltaRuleStatesOf {
  using type = Kokkos::View<const float*, M>;
};
template <class M>
using DeltaRuleStates = typename DeltaRuleStatesOf<M>::type;

namespace impl {

/// sum_i a[i] b[i], in kRowLanes interleaved partial sums folded in a fixed order (a float
/// sum vectorises only so: the compiler may not reorder it).
KOKKOS_INLINE_FUNCTION float delta_dot(const float* a, const float* b, int64_t n) {
  float acc[kRowLanes] = {};
  int64_t i = 0;
  for (; i + kRowLanes <= n; i += kRowLanes)
    for (int l = 0; l < kRowLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  for (int w = kRowLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

/// One chunk's recomputable terms, in a team's scratch (row-major, n <= 64 rows): G, its
/// exp(G_i) and exp(G_last - G_i), Gamma, B = (K K^T) . Gamma and P = (Q K^T) . Gamma (lower,
/// the diagonal included), Tinv, U, W and Vn = U - W S0.
template <class Scratch>
struct DeltaChunk {
  Scratch G, eG, eL, Gam, B, Tinv, P, U, W, Vn;  // [C] x3; [C x C] x4; U, Vn [C x dv]; W [C x dk]
};

/// A team's scratch floats: the forward's chunk terms and state, and the backward's more.
inline int64_t delta_rule_scratch_floats(const DeltaRuleShape& s, bool backward) {
  const int64_t c = DeltaRuleShape::kChunk, dk = s.dk, dv = s.dv;
  const int64_t forward = 3 * c + 4 * c * c + c * (2 * dv + dk) + dk * dv;
  // (backward: DP, DA [c x c]; dVn, Ru [c x dv]; dW, Rw, SQ, KD [c x dk]; dG, Tk [c]; dS
  // twice)
  return forward + (backward ? 2 * c * c + 2 * c * dv + 4 * c * dk + 2 * c + dk * dv : 0);
}

/// The chunk [t0, t0 + n) of value head h (key head kh): its terms (DeltaChunk) into c.
template <class Team, class Mat, class Vec, class Scratch, class StatePtr>
KOKKOS_INLINE_FUNCTION void delta_chunk_terms(const Team& team, const DeltaRuleShape& s, int64_t h,
                                              int64_t t0, int64_t n, const Mat& Q, const Mat& K,
                                              const Mat& V, const Vec& beta, const Vec& g,
                                              const StatePtr S0, const DeltaChunk<Scratch>& c) {
  constexpr int64_t C = DeltaRuleShape::kChunk;
  const int64_t dk = s.dk, dv = s.dv, kc = s.key_of(h) * dk, vc = h * dv;
  Kokkos::single(Kokkos::PerTeam(team), [&] {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      acc += g(t0 + i, h);
      c.G(i) = acc;
    }
  });
  team.team_barrier();
  row_for(team, 0, n, [&](int64_t i) {
    c.eG(i) = expf(c.G(i));
    c.eL(i) = expf(c.G(n - 1) - c.G(i));
  });
  row_for(team, 0, n * n, [&](int64_t ij) {
    const int64_t i = ij / n, j = ij % n;
    if (j > i) return;
    const float* kj = &K(t0 + j, kc);
    const float kk = delta_dot(&K(t0 + i, kc), kj, dk), qk = delta_dot(&Q(t0 + i, kc), kj, dk);
    const float gamma = expf(c.G(i) - c.G(j));
    c.Gam(i * C + j) = gamma;
    c.B(i * C + j) = kk * gamma;
    c.P(i * C + j) = qk * gamma;
  });
  team.team_barrier();
  // T = (I + A)^-1 by forward substitution, A_ij = beta_i B_ij (j < i): row i of T is
  // e_i - sum_{j < i} A_ij T_j (rows j < i done before).
  for (int64_t i = 0; i < n; ++i) {
    const float bi = beta(t0 + i, h);
    row_for(team, 0, i + 1, [&](int64_t col) {
      float v = col == i ? 1.0f : 0.0f;
      for (int64_t j = col; j < i; ++j) v -= bi * c.B(i * C + j) * c.Tinv(j * C + col);
      c.Tinv(i * C + col) = v;
    });
    team.team_barrier();
  }
  // U = T diag(beta) V, W = T diag(beta exp(G)) K, a row each
  row_for(team, 0, n, [&](int64_t i) {
    float* u = &c.U(i * dv);
    float* w = &c.W(i * dk);
    for (int64_t e = 0; e < dv; ++e) u[e] = 0.0f;
    for (int64_t d = 0; d < dk; ++d) w[d] = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      const float tb = c.Tinv(i * C + j) * beta(t0 + j, h), tk = tb * c.eG(j);
      const float* vj = &V(t0 + j, vc);
      const float* kj = &K(t0 + j, kc);
      for (int64_t e = 0; e < dv; ++e) u[e] += tb * vj[e];
      for (int64_t d = 0; d < dk; ++d) w[d] += tk * kj[d];
    }
  });
  team.team_barrier();
  // Vn = U - W S0
  row_for(team, 0, n, [&](int64_t i) {
    float* vn = &c.Vn(i * dv);
    for (int64_t e = 0; e < dv; ++e) vn[e] = c.U(i * dv + e);
    for (int64_t d = 0; d < dk; ++d) {
      const float wd = c.W(i * dk + d);
      for (int64_t e = 0; e < dv; ++e) vn[e] -= wd * S0[d * dv + e];
    }
  });
  team.team_barrier();
}

template <class ExecSpace>
using DeltaScratch = Kokkos::View<float*, typename ExecSpace::scratch_memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class ExecSpace, class Team>
KOKKOS_INLINE_FUNCTION DeltaChunk<DeltaScratch<ExecSpace>> delta_chunk_scratch(
    const Team& team, const DeltaRuleShape& s) {
  constexpr int64_t C = DeltaRuleShape::kChunk;
  using V = DeltaScratch<ExecSpace>;
  const auto take = [&](int64_t count) { return V(team.team_scratch(1), count); };
  DeltaChunk<V> c;
  c.G = take(C);
  c.eG = take(C);
  c.eL = take(C);
  c.Gam = take(C * C);
  c.B = take(C * C);
  c.Tinv = take(C * C);
  c.P = take(C * C);
  c.U = take(C * s.dv);
  c.W = take(C * s.dk);
  c.Vn = take(C * s.dv);
  return c;
}

}  // namespace impl

/// O [tokens, value_heads * dv] from Q, K [tokens, key_heads * dk], V [tokens, value_heads *
/// dv], beta, g [tokens, value_heads]; each chunk's starting state into `states`
/// [docs.chunks * value_heads * dk * dv] (chunk-major, then head) for the backward.
template <class ExecSpace, class M>
void gated_delta_rule_forward(const ExecSpace& exec, const DeltaRuleShape& s,
                              const DeltaRuleDocuments<M>& docs, const DeltaRuleInput<M>& Q,
                              const DeltaRuleInput<M>& K, const DeltaRuleInput<M>& V,
                              const DeltaRuleInput<M>& beta, const DeltaRuleInput<M>& g,
                              const Kokkos::View<float**, Kokkos::LayoutRight, M>& O,
                              const Kokkos::View<float*, M>& states) {
  KQLORA_CHECK(s.key_heads > 0 && s.value_heads % s.key_heads == 0 && s.dk > 0 && s.dv > 0,
               "gated_delta_rule: heads");
  KQLORA_CHECK(static_cast<int64_t>(states.extent(0)) >= docs.chunks * s.value_heads * s.dk * s.dv,
               "gated_delta_rule: states");
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  constexpr int64_t C = DeltaRuleShape::kChunk;
  const int64_t H = s.value_heads, dk = s.dk, dv = s.dv;
  const int64_t scratch = impl::delta_rule_scratch_floats(s, false) * 4;
  const auto first = docs.first, length = docs.length, chunk0 = docs.chunk0;
  Kokkos::parallel_for(
      "kqlora::gated_delta_rule_forward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(docs.count * H), Kokkos::AUTO)
          .set_scratch_size(1, Kokkos::PerTeam(scratch)),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t doc = team.league_rank() / H, h = team.league_rank() % H;
        const int64_t kc = s.key_of(h) * dk, vc = h * dv;
        const auto c = impl::delta_chunk_scratch<ExecSpace>(team, s);
        const impl::DeltaScratch<ExecSpace> S(team.team_scratch(1), dk * dv);
        row_for(team, 0, dk * dv, [&](int64_t x) { S(x) = 0.0f; });
        team.team_barrier();
        for (int64_t at = 0, ci = 0; at < length(doc); at += C, ++ci) {
          const int64_t t0 = first(doc) + at, n = length(doc) - at < C ? length(doc) - at : C;
          float* saved = &states(((chunk0(doc) + ci) * H + h) * dk * dv);
          row_for(team, 0, dk * dv, [&](int64_t x) { saved[x] = S(x); });
          impl::delta_chunk_terms(team, s, h, t0, n, Q, K, V, beta, g, S.data(), c);
          // O = diag(exp(G)) Q S0 + P Vn, a row each
          row_for(team, 0, n, [&](int64_t i) {
            float* o = &O(t0 + i, vc);
            const float* qi = &Q(t0 + i, kc);
            for (int64_t e = 0; e < dv; ++e) o[e] = 0.0f;
            for (int64_t d = 0; d < dk; ++d) {
              const float qd = c.eG(i) * qi[d];
              for (int64_t e = 0; e < dv; ++e) o[e] += qd * S(d * dv + e);
            }
            for (int64_t j = 0; j <= i; ++j) {
              const float p = c.P(i * C + j);
              for (int64_t e = 0; e < dv; ++e) o[e] += p * c.Vn(j * dv + e);
            }
          });
          team.team_barrier();
          // S1 = exp(G_last) S0 + (diag(exp(G_last - G)) K)^T Vn, a row d each
          const float decay = c.eG(n - 1);
          row_for(team, 0, dk, [&](int64_t d) {
            float* sd = &S(d * dv);
            for (int64_t e = 0; e < dv; ++e) sd[e] *= decay;
            for (int64_t i = 0; i < n; ++i) {
              const float f = c.eL(i) * K(t0 + i, kc + d);
              for (int64_t e = 0; e < dv; ++e) sd[e] += f * c.Vn(i * dv + e);
            }
          });
          team.team_barrier();
        }
      });
}

/// The gradients of O's consumer: from dO, dQv and dKv [tokens, value_heads * dk] (each
/// value head's share: a key head's gradient is the sum over its value heads,
/// delta_rule_key_gradient), dV [tokens, value_heads * dv], dbeta and dg [tokens,
/// value_heads], all written. The final states get no gradient.
template <class ExecSpace, class M>
void gated_delta_rule_backward(const ExecSpace& exec, const DeltaRuleShape& s,
                               const DeltaRuleDocuments<M>& docs, const DeltaRuleInput<M>& Q,
                               const DeltaRuleInput<M>& K, const DeltaRuleInput<M>& V,
                               const DeltaRuleInput<M>& beta, const DeltaRuleInput<M>& g,
                               const DeltaRuleStates<M>& states, const DeltaRuleInput<M>& dO,
                               const Kokkos::View<float**, Kokkos::LayoutRight, M>& dQv,
                               const Kokkos::View<float**, Kokkos::LayoutRight, M>& dKv,
                               const Kokkos::View<float**, Kokkos::LayoutRight, M>& dV,
                               const Kokkos::View<float**, Kokkos::LayoutRight, M>& dbeta,
                               const Kokkos::View<float**, Kokkos::LayoutRight, M>& dg) {
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Scratch = impl::DeltaScratch<ExecSpace>;
  constexpr int64_t C = DeltaRuleShape::kChunk;
  const int64_t H = s.value_heads, dk = s.dk, dv = s.dv;
  const int64_t scratch = impl::delta_rule_scratch_floats(s, true) * 4;
  const auto first = docs.first, length = docs.length, chunk0 = docs.chunk0;
  Kokkos::parallel_for(
      "kqlora::gated_delta_rule_backward",
      Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(docs.count * H), Kokkos::AUTO)
          .set_scratch_size(1, Kokkos::PerTeam(scratch)),
      KOKKOS_LAMBDA(const Team& team) {
        const int64_t doc = team.league_rank() / H, h = team.league_rank() % H;
        const int64_t kc = s.key_of(h) * dk, vc = h * dv, qv = h * dk;
        const auto c = impl::delta_chunk_scratch<ExecSpace>(team, s);
        const auto take = [&](int64_t count) { return Scratch(team.team_scratch(1), count); };
        const Scratch DP = take(C * C), DA = take(C * C), dVn = take(C * dv), Ru = take(C * dv),
                      dW = take(C * dk), Rw = take(C * dk), SQ = take(C * dk), KD = take(C * dk),
                      dG = take(C), Tk = take(C), dS = take(dk * dv), dS0 = take(dk * dv);
        row_for(team, 0, dk * dv, [&](int64_t x) { dS(x) = 0.0f; });
        team.team_barrier();
        const int64_t chunks = (length(doc) + C - 1) / C;
        for (int64_t ci = chunks - 1; ci >= 0; --ci) {
          const int64_t at = ci * C, t0 = first(doc) + at;
          const int64_t n = length(doc) - at < C ? length(doc) - at : C;
          const float* S0 = &states(((chunk0(doc) + ci) * H + h) * dk * dv);
          impl::delta_chunk_terms(team, s, h, t0, n, Q, K, V, beta, g, S0, c);
          // dVn = P^T dO + diag(exp(G_L - G)) K dS; SQ = dO S0^T, KD = Vn dS^T (a row each)
          row_for(team, 0, n, [&](int64_t i) {
            float* r = &dVn(i * dv);
            const float* ki = &K(t0 + i, kc);
            for (int64_t e = 0; e < dv; ++e) r[e] = 0.0f;
            for (int64_t q = i; q < n; ++q) {
              const float p = c.P(q * C + i);
              const float* dq = &dO(t0 + q, vc);
              for (int64_t e = 0; e < dv; ++e) r[e] += p * dq[e];
            }
            const float* doi = &dO(t0 + i, vc);
            for (int64_t d = 0; d < dk; ++d) {
              const float f = c.eL(i) * ki[d];
              const float* dsd = &dS(d * dv);
              for (int64_t e = 0; e < dv; ++e) r[e] += f * dsd[e];
              SQ(i * dk + d) = impl::delta_dot(S0 + d * dv, doi, dv);
              KD(i * dk + d) = impl::delta_dot(&c.Vn(i * dv), dsd, dv);
            }
          });
          // DP = dO Vn^T (lower, diagonal included)
          row_for(team, 0, n * n, [&](int64_t ij) {
            const int64_t i = ij / n, j = ij % n;
            if (j > i) return;
            DP(i * C + j) = impl::delta_dot(&dO(t0 + i, vc), &c.Vn(j * dv), dv);
          });
          team.team_barrier();
          // dW = -dVn S0^T; Ru = Tinv^T dVn (a row each)
          row_for(team, 0, n, [&](int64_t j) {
            float* ru = &Ru(j * dv);
            for (int64_t e = 0; e < dv; ++e) ru[e] = 0.0f;
            for (int64_t i = j; i < n; ++i) {
              const float t = c.Tinv(i * C + j);
              for (int64_t e = 0; e < dv; ++e) ru[e] += t * dVn(i * dv + e);
            }
            for (int64_t d = 0; d < dk; ++d)
              dW(j * dk + d) = -impl::delta_dot(&dVn(j * dv), S0 + d * dv, dv);
          });
          team.team_barrier();
          // Rw = Tinv^T dW
          row_for(team, 0, n, [&](int64_t j) {
            float* rw = &Rw(j * dk);
            for (int64_t d = 0; d < dk; ++d) rw[d] = 0.0f;
            for (int64_t i = j; i < n; ++i) {
              const float t = c.Tinv(i * C + j);
              for (int64_t d = 0; d < dk; ++d) rw[d] += t * dW(i * dk + d);
            }
          });
          team.team_barrier();
          // DA = -(Ru U^T + Rw W^T), strictly lower
          row_for(team, 0, n * n, [&](int64_t ij) {
            const int64_t i = ij / n, j = ij % n;
            if (j >= i) return;
            DA(i * C + j) = -(impl::delta_dot(&Ru(i * dv), &c.U(j * dv), dv) +
                              impl::delta_dot(&Rw(i * dk), &c.W(j * dk), dk));
          });
          team.team_barrier();
          // Per token: dQ, dK, dV, dbeta and the gradient of G.
          row_for(team, 0, n, [&](int64_t i) {
            const int64_t t = t0 + i;
            const float bi = beta(t, h), ei = c.eG(i), li = c.eL(i);
            float* dq = &dQv(t, qv);
            float* dkr = &dKv(t, qv);
            const float* qi = &Q(t, kc);
            const float* ki = &K(t, kc);
            float dgi = 0.0f, dbi = 0.0f, tk = 0.0f;
            for (int64_t d = 0; d < dk; ++d) {
              const float sq = SQ(i * dk + d), kd = KD(i * dk + d), rw = Rw(i * dk + d);
              dq[d] = ei * sq;
              dkr[d] = li * kd + bi * ei * rw;
              dgi += ei * qi[d] * sq + bi * ei * ki[d] * rw;
              tk += li * ki[d] * kd;
              dbi += ei * ki[d] * rw;
            }
            dgi -= tk;
            for (int64_t j = 0; j <= i; ++j) {
              const float gam = c.Gam(i * C + j), wq = DP(i * C + j) * gam;
              const float wk = j < i ? DA(i * C + j) * bi * gam : 0.0f;
              const float* kj = &K(t0 + j, kc);
              for (int64_t d = 0; d < dk; ++d) {
                dq[d] += wq * kj[d];
                dkr[d] += wk * kj[d];
              }
              dgi += DP(i * C + j) * c.P(i * C + j);
              if (j < i) {
                dgi += DA(i * C + j) * bi * c.B(i * C + j);
                dbi += DA(i * C + j) * c.B(i * C + j);
              }
            }
            for (int64_t r = i; r < n; ++r) {
              const float gam = c.Gam(r * C + i), wq = DP(r * C + i) * gam;
              const float wk = r > i ? DA(r * C + i) * beta(t0 + r, h) * gam : 0.0f;
              const float* qr = &Q(t0 + r, kc);
              const float* kr = &K(t0 + r, kc);
              for (int64_t d = 0; d < dk; ++d) dkr[d] += wq * qr[d] + wk * kr[d];
              dgi -= DP(r * C + i) * c.P(r * C + i);
              if (r > i) dgi -= DA(r * C + i) * beta(t0 + r, h) * c.B(r * C + i);
            }
            const float* vi = &V(t, vc);
            float* dvi = &dV(t, vc);
            for (int64_t e = 0; e < dv; ++e) {
              dvi[e] = bi * Ru(i * dv + e);
              dbi += vi[e] * Ru(i * dv + e);
            }
            dG(i) = dgi;
            Tk(i) = tk;
            dbeta(t, h) = dbi;
          });
          team.team_barrier();
          // G_L's own terms: exp(G_L) <S0, dS>, and sum_i exp(G_L - G_i) K_i . (dS Vn_i)
          const float s0ds = row_sum(team, 0, dk * dv, [&](int64_t x) { return S0[x] * dS(x); });
          // dS0 = exp(G_L) dS + (diag(exp(G)) Q)^T dO - W^T dVn, a row d each
          const float decay = c.eG(n - 1);
          row_for(team, 0, dk, [&](int64_t d) {
            float* r = &dS0(d * dv);
            const float* dsd = &dS(d * dv);
            for (int64_t e = 0; e < dv; ++e) r[e] = decay * dsd[e];
            for (int64_t i = 0; i < n; ++i) {
              const float fq = c.eG(i) * Q(t0 + i, kc + d), fw = c.W(i * dk + d);
              const float* doi = &dO(t0 + i, vc);
              for (int64_t e = 0; e < dv; ++e) r[e] += fq * doi[e] - fw * dVn(i * dv + e);
            }
          });
          team.team_barrier();
          // dg_j = sum_{i >= j} dG_i (G is the running sum of g)
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            float acc = decay * s0ds;
            for (int64_t i = 0; i < n; ++i) acc += Tk(i);
            for (int64_t i = n - 1; i >= 0; --i) {
              acc += dG(i);
              dg(t0 + i, h) = acc;
            }
          });
          row_for(team, 0, dk * dv, [&](int64_t x) { dS(x) = dS0(x); });
          team.team_barrier();
        }
      });
}

/// dK [tokens, key_heads * dk] = the sum of dKv over each key head's value heads (the
/// same for dQ).
template <class ExecSpace, class M>
void delta_rule_key_gradient(const ExecSpace& exec, const DeltaRuleShape& s,
                             const DeltaRuleInput<M>& per_value,
                             const Kokkos::View<float**, Kokkos::LayoutRight, M>& per_key) {
  const int64_t dk = s.dk, group = s.value_heads / s.key_heads;
  Kokkos::parallel_for(
      "kqlora::delta_rule_key_gradient",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<int64_t>>(
          exec, {0, 0}, {static_cast<int64_t>(per_key.extent(0)), s.key_heads * dk}),
      KOKKOS_LAMBDA(int64_t t, int64_t x) {
        const int64_t kh = x / dk, d = x % dk;
        float acc = 0.0f;
        for (int64_t j = 0; j < group; ++j) acc += per_value(t, (kh * group + j) * dk + d);
        per_key(t, x) = acc;
      });
}

}  // namespace kqlora
