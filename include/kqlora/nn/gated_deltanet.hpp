#pragma once
// A Gated DeltaNet layer's token mixer between its projections (transformers'
// Qwen3_5GatedDeltaNet; docs/MODELS.md, "Gated DeltaNet"). From the projections' outputs
// mixed = in_proj_qkv(h) [tokens, 2 key_dim + value_dim], z = in_proj_z(h) [tokens,
// value_dim], b = in_proj_b(h) and a = in_proj_a(h) [tokens, value_heads], to out_proj's
// input y [tokens, value_dim]:
//   c = silu(causal depthwise conv(mixed))            (nn/causal_conv1d.hpp)
//   q, k, v = c's columns [0, kd), [kd, 2 kd), [2 kd, ...)
//   q = l2norm(q) dk^-1/2, k = l2norm(k) per key head  (x rsqrt(sum x^2 + 1e-6), float32)
//   beta = sigmoid(b) (rounded in bfloat16); g = -exp(A_log) softplus(a + dt_bias) (float32)
//   o = the gated delta rule (nn/gated_delta_rule.hpp), rounded in bfloat16
//   y = gated RMSNorm of o with z                     (nn/gated_rms_norm.hpp)
// A_log, dt_bias, the conv weight and the norm weight are frozen; the backward gives the
// gradients of mixed, z, b and a (into the projections' backward).

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "kqlora/nn/attention.hpp"
#include "kqlora/nn/causal_conv1d.hpp"
#include "kqlora/nn/gated_delta_rule.hpp"
#include "kqlora/nn/gated_rms_norm.hpp"

namespace kqlora {

struct GatedDeltaNetShape {
  DeltaRuleShape rule;
  int64_t kernel = 4;      // linear_conv_kernel_dim
  float norm_eps = 1e-6f;  // rms_norm_eps (the gated norm's)
  int64_t key_dim() const { return rule.key_heads * rule.dk; }
  int64_t value_dim() const { return rule.value_heads * rule.dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

/// The frozen tensors of one layer.
template <class M>
struct GatedDeltaNetWeights {
  Kokkos::View<const float*, M> conv;     // [conv_dim * kernel]
  Kokkos::View<const float*, M> a_log;    // [value_heads]
  Kokkos::View<const float*, M> dt_bias;  // [value_heads]
  Kokkos::View<const float*, M> norm;     // [dv]
};

/// What the forward keeps for the backward, and the backward's scratch ([tokens, ...]).
template <class M>
struct GatedDeltaNetBuffers {
  Matrix<M> conv, q, k, v, beta, g, core;  // conv [T, conv_dim]; q, k [T, key_dim]; ...
  Kokkos::View<float*, M> inv_q, inv_k, inv_norm, states;
  Matrix<M> d_core, dq_per_value, dk_per_value, dq, dk, dv, dbeta, dg, d_conv;
  int64_t tokens = 0, chunks = 0;

  void reserve(const GatedDeltaNetShape& s, int64_t T, int64_t chunk_count) {
    const DeltaRuleShape& r = s.rule;
    const auto mat = [&](Matrix<M>& m, int64_t cols, const char* name) {
      if (static_cast<int64_t>(m.extent(0)) < T || static_cast<int64_t>(m.extent(1)) != cols)
        m = Matrix<M>(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                         std::string("kqlora::gated_deltanet::") + name),
                      T, cols);
    };
    const auto vec = [&](Kokkos::View<float*, M>& v, int64_t n, const char* name) {
      if (static_cast<int64_t>(v.extent(0)) < n)
        v = Kokkos::View<float*, M>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing,
                               std::string("kqlora::gated_deltanet::") + name),
            n);
    };
    mat(conv, s.conv_dim(), "conv");
    mat(q, s.key_dim(), "q");
    mat(k, s.key_dim(), "k");
    mat(v, s.value_dim(), "v");
    mat(beta, r.value_heads, "beta");
    mat(g, r.value_heads, "g");
    mat(core, s.value_dim(), "core");
    vec(inv_q, T * r.key_heads, "inv_q");
    vec(inv_k, T * r.key_heads, "inv_k");
    vec(inv_norm, T * r.value_heads, "inv_norm");
    vec(states, chunk_count * r.value_heads * r.dk * r.dv, "states");
    mat(d_core, s.value_dim(), "d_core");
    mat(dq_per_value, r.value_heads * r.dk, "dq_per_value");
    mat(dk_per_value, r.value_heads * r.dk, "dk_per_value");
    mat(dq, s.key_dim(), "dq");
    mat(dk, s.key_dim(), "dk");
    mat(dv, s.value_dim(), "dv");
    mat(dbeta, r.value_heads, "dbeta");
    mat(dg, r.value_heads, "dg");
    mat(d_conv, s.conv_dim(), "d_conv");
    tokens = T;
    chunks = chunk_count;
  }
};

namespace impl {

/// The first T rows of m.
template <class M>
Matrix<M> rows_of(const Matrix<M>& m, int64_t T) {
  return Matrix<M>(m.data(), T, m.extent(1));
}

KOKKOS_INLINE_FUNCTION float softplus(float x) {
  // (torch's: x above the threshold 20 is returned as is)
  return x > 20.0f ? x : log1pf(expf(x));
}

}  // namespace impl

/// y from mixed, z, b, a for rows of S tokens (doc_start: packed rows' documents, or empty).
template <class ExecSpace, class M>
void gated_deltanet_forward(const ExecSpace& exec, const GatedDeltaNetShape& s,
                            const DeltaRuleDocuments<M>& docs, int64_t S,
                            const DocStarts<M>& doc_start, const Matrix<M>& mixed,
                            const Matrix<M>& z, const Matrix<M>& b, const Matrix<M>& a,
                            const GatedDeltaNetWeights<M>& w, bool bf16,
                            GatedDeltaNetBuffers<M>& buf, const Matrix<M>& y) {
  const int64_t T = mixed.extent(0), kd = s.key_dim(), vd = s.value_dim(), dk = s.rule.dk;
  const int64_t Hk = s.rule.key_heads, Hv = s.rule.value_heads;
  buf.reserve(s, T, docs.chunks);
  const auto conv = impl::rows_of(buf.conv, T), q = impl::rows_of(buf.q, T),
             k = impl::rows_of(buf.k, T), v = impl::rows_of(buf.v, T),
             beta = impl::rows_of(buf.beta, T), g = impl::rows_of(buf.g, T),
             core = impl::rows_of(buf.core, T);
  causal_conv1d_silu_forward(exec, mixed, w.conv, s.kernel, S, doc_start, bf16, conv);
  const auto inv_q = buf.inv_q, inv_k = buf.inv_k;
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::l2norm", over(exec, T, 2 * Hk), KOKKOS_LAMBDA(int64_t t, int64_t x) {
        const bool is_q = x < Hk;
        const int64_t h = is_q ? x : x - Hk, c0 = (is_q ? 0 : kd) + h * dk;
        float ss = 0.0f;
        for (int64_t d = 0; d < dk; ++d) ss += conv(t, c0 + d) * conv(t, c0 + d);
        const float r = 1.0f / sqrtf(ss + 1e-6f);
        (is_q ? inv_q : inv_k)(t * Hk + h) = r;
        for (int64_t d = 0; d < dk; ++d) {
          if (is_q)
            q(t, h * dk + d) = conv(t, c0 + d) * r * scale;
          else
            k(t, h * dk + d) = conv(t, c0 + d) * r;
        }
      });
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::v", over(exec, T, vd),
      KOKKOS_LAMBDA(int64_t t, int64_t e) { v(t, e) = conv(t, 2 * kd + e); });
  const auto a_log = w.a_log, dt_bias = w.dt_bias;
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::beta_g", over(exec, T, Hv), KOKKOS_LAMBDA(int64_t t, int64_t h) {
        const float bt = 1.0f / (1.0f + expf(-b(t, h)));
        beta(t, h) = bf16 ? round_to_bf16(bt) : bt;
        g(t, h) = -expf(a_log(h)) * impl::softplus(a(t, h) + dt_bias(h));
      });
  gated_delta_rule_forward(exec, s.rule, docs, q, k, v, beta, g, core, buf.states);
  if (bf16) round_bf16(exec, core);
  gated_rms_norm_forward(exec, core, z, w.norm, s.rule.dv, s.norm_eps, bf16, y, buf.inv_norm);
}

/// d_mixed, dz, db, da from dy (after gated_deltanet_forward on the same inputs).
template <class ExecSpace, class M>
void gated_deltanet_backward(const ExecSpace& exec, const GatedDeltaNetShape& s,
                             const DeltaRuleDocuments<M>& docs, int64_t S,
                             const DocStarts<M>& doc_start, const Matrix<M>& mixed,
                             const Matrix<M>& z, const Matrix<M>& a,
                             const GatedDeltaNetWeights<M>& w, bool bf16,
                             GatedDeltaNetBuffers<M>& buf, const Matrix<M>& dy,
                             const Matrix<M>& d_mixed, const Matrix<M>& dz, const Matrix<M>& db,
                             const Matrix<M>& da) {
  const int64_t T = mixed.extent(0), kd = s.key_dim(), vd = s.value_dim(), dk = s.rule.dk;
  const int64_t Hk = s.rule.key_heads, Hv = s.rule.value_heads;
  const auto conv = impl::rows_of(buf.conv, T), q = impl::rows_of(buf.q, T),
             k = impl::rows_of(buf.k, T), v = impl::rows_of(buf.v, T),
             beta = impl::rows_of(buf.beta, T), g = impl::rows_of(buf.g, T),
             core = impl::rows_of(buf.core, T), d_core = impl::rows_of(buf.d_core, T),
             dqv = impl::rows_of(buf.dq_per_value, T), dkv = impl::rows_of(buf.dk_per_value, T),
             dq = impl::rows_of(buf.dq, T), dkk = impl::rows_of(buf.dk, T),
             dv = impl::rows_of(buf.dv, T), dbeta = impl::rows_of(buf.dbeta, T),
             dg = impl::rows_of(buf.dg, T), d_conv = impl::rows_of(buf.d_conv, T);
  gated_rms_norm_backward(exec, core, z, w.norm, s.rule.dv, bf16,
                          Kokkos::View<const float*, M>(buf.inv_norm), dy, d_core, dz);
  gated_delta_rule_backward(exec, s.rule, docs, q, k, v, beta, g, buf.states, d_core, dqv, dkv, dv,
                            dbeta, dg);
  delta_rule_key_gradient(exec, s.rule, dqv, dq);
  delta_rule_key_gradient(exec, s.rule, dkv, dkk);
  // Back through the L2 norms (and q's scale): dx = r (dy - y (y . dy)), y = x r.
  const auto inv_q = buf.inv_q, inv_k = buf.inv_k;
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::l2norm_backward", over(exec, T, 2 * Hk),
      KOKKOS_LAMBDA(int64_t t, int64_t x) {
        const bool is_q = x < Hk;
        const int64_t h = is_q ? x : x - Hk, c0 = (is_q ? 0 : kd) + h * dk;
        const float r = (is_q ? inv_q : inv_k)(t * Hk + h), f = is_q ? scale : 1.0f;
        const Matrix<M>& grad = is_q ? dq : dkk;
        float dot = 0.0f;
        for (int64_t d = 0; d < dk; ++d) dot += conv(t, c0 + d) * r * f * grad(t, h * dk + d);
        for (int64_t d = 0; d < dk; ++d) {
          const float gy = f * grad(t, h * dk + d), y = conv(t, c0 + d) * r;
          const float gx = r * (gy - y * dot);
          d_conv(t, c0 + d) = bf16 ? round_to_bf16(gx) : gx;
        }
      });
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::dv", over(exec, T, vd), KOKKOS_LAMBDA(int64_t t, int64_t e) {
        d_conv(t, 2 * kd + e) = bf16 ? round_to_bf16(dv(t, e)) : dv(t, e);
      });
  const auto a_log = w.a_log, dt_bias = w.dt_bias;
  Kokkos::parallel_for(
      "kqlora::gated_deltanet::beta_g_backward", over(exec, T, Hv),
      KOKKOS_LAMBDA(int64_t t, int64_t h) {
        const float bt = beta(t, h);
        const float gb = bf16 ? round_to_bf16(dbeta(t, h)) : dbeta(t, h);
        const float vb = gb * bt * (1.0f - bt);
        db(t, h) = bf16 ? round_to_bf16(vb) : vb;
        const float u = a(t, h) + dt_bias(h);
        const float va = -dg(t, h) * expf(a_log(h)) / (1.0f + expf(-u));
        da(t, h) = bf16 ? round_to_bf16(va) : va;
      });
  causal_conv1d_silu_backward(exec, mixed, w.conv, s.kernel, S, doc_start, bf16, d_conv, d_mixed);
}

}  // namespace kqlora
