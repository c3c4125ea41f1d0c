// A Gated DeltaNet layer's token mixer (nn/gated_deltanet.hpp: the causal conv with SiLU,
// the q/k L2 norms, beta and the decay, the gated delta rule, the gated RMSNorm) against
// the same chain written out here in float64 from its definition (docs/MODELS.md, "Gated
// DeltaNet"): outputs on packed and unpacked rows, and the gradients of every input (the
// four projections' outputs) against central finite differences of the float64 chain.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "central_differences.hpp"
#include "exec_spaces.hpp"
#include "kqlora/nn/gated_deltanet.hpp"

namespace {

using D = std::vector<double>;
using kqlora_test::max_abs;
using kqlora_test::max_diff;

struct Case {
  kqlora::GatedDeltaNetShape s;
  int64_t n = 0, S = 0;
  D mixed, z, b, a;                // the projections' outputs
  D conv, a_log, dt_bias, norm;    // the frozen tensors
  std::vector<int32_t> doc_start;  // per token: its document's first token in the row
  int64_t T() const { return n * S; }
};

Case make_case(int64_t n, int64_t S, uint32_t seed) {
  Case c;
  c.s.rule = {1, 2, 4, 3};  // a key head read by two value heads, dk 4, dv 3
  c.s.kernel = 4;
  c.s.norm_eps = 1e-6f;
  c.n = n;
  c.S = S;
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  const auto fill = [&](D& x, int64_t count, double scale, double shift) {
    x.resize(static_cast<size_t>(count));
    for (double& v : x) v = shift + scale * normal(gen);
  };
  const int64_t T = n * S, Hv = c.s.rule.value_heads;
  fill(c.mixed, T * c.s.conv_dim(), 1.0, 0.0);
  fill(c.z, T * c.s.value_dim(), 1.0, 0.0);
  fill(c.b, T * Hv, 1.0, 0.0);
  fill(c.a, T * Hv, 1.0, -1.0);
  fill(c.conv, c.s.conv_dim() * c.s.kernel, 0.5, 0.0);
  fill(c.a_log, Hv, 0.5, -0.5);
  fill(c.dt_bias, Hv, 0.5, 0.0);
  fill(c.norm, c.s.rule.dv, 0.2, 1.0);
  c.doc_start.assign(static_cast<size_t>(T), 0);
  return c;
}

double silu(double x) {
  return x / (1 + std::exp(-x));
}

// The float64 chain: y [T, value_dim].
D mixer(const Case& c) {
  const auto& s = c.s;
  const auto& r = s.rule;
  const int64_t T = c.T(), C = s.conv_dim(), K = s.kernel, kd = s.key_dim(), Hv = r.value_heads;
  const int64_t dk = r.dk, dv = r.dv;
  D conv(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t first = (t / c.S) * c.S + c.doc_start[t];
    for (int64_t ch = 0; ch < C; ++ch) {
      double pre = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= first) pre += c.conv[ch * K + j] * c.mixed[src * C + ch];
      }
      conv[t * C + ch] = silu(pre);
    }
  }
  D y(static_cast<size_t>(T * s.value_dim()));
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = r.key_of(h);
    D S(static_cast<size_t>(dk * dv), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      if (c.doc_start[t] == t % c.S) std::fill(S.begin(), S.end(), 0.0);
      D q(dk), k(dk);
      double qq = 0, kk = 0;
      for (int64_t d = 0; d < dk; ++d) {
        q[d] = conv[t * C + kh * dk + d];
        k[d] = conv[t * C + kd + kh * dk + d];
        qq += q[d] * q[d];
        kk += k[d] * k[d];
      }
      for (int64_t d = 0; d < dk; ++d) {
        q[d] /= std::sqrt(qq + 1e-6) * std::sqrt(static_cast<double>(dk));
        k[d] /= std::sqrt(kk + 1e-6);
      }
      const double beta = 1 / (1 + std::exp(-c.b[t * Hv + h]));
      const double u = c.a[t * Hv + h] + c.dt_bias[h];
      const double g = -std::exp(c.a_log[h]) * std::log1p(std::exp(u));
      for (double& x : S) x *= std::exp(g);
      D o(dv);
      for (int64_t e = 0; e < dv; ++e) {
        double kv = 0;
        for (int64_t d = 0; d < dk; ++d) kv += S[d * dv + e] * k[d];
        const double delta = beta * (conv[t * C + 2 * kd + h * dv + e] - kv);
        for (int64_t d = 0; d < dk; ++d) S[d * dv + e] += k[d] * delta;
      }
      double ms = 0;
      for (int64_t e = 0; e < dv; ++e) {
        o[e] = 0;
        for (int64_t d = 0; d < dk; ++d) o[e] += S[d * dv + e] * q[d];
        ms += o[e] * o[e] / static_cast<double>(dv);
      }
      for (int64_t e = 0; e < dv; ++e) {
        const int64_t at = t * s.value_dim() + h * dv + e;
        y[at] = c.norm[e] * o[e] / std::sqrt(ms + s.norm_eps) * silu(c.z[at]);
      }
    }
  }
  return y;
}

template <class M>
kqlora::Matrix<M> to_view(const D& x, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(x.size()) / rows;
  kqlora::Matrix<M> out("x", rows, cols);
  auto h = Kokkos::create_mirror_view(out);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) h(i, j) = static_cast<float>(x[i * cols + j]);
  Kokkos::deep_copy(out, h);
  return out;
}

template <class M>
Kokkos::View<const float*, M> to_vector(const D& x) {
  Kokkos::View<float*, M> out("w", x.size());
  auto h = Kokkos::create_mirror_view(out);
  for (size_t i = 0; i < x.size(); ++i) h(i) = static_cast<float>(x[i]);
  Kokkos::deep_copy(out, h);
  return out;
}

template <class M>
D to_doubles(const kqlora::Matrix<M>& x) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  return D(h.data(), h.data() + h.size());
}

struct Result {
  D y, d_mixed, dz, db, da;
};

template <class Exec>
Result run(const Case& c, const D* dy) {
  using M = typename Exec::memory_space;
  Exec exec;
  const int64_t T = c.T();
  const auto docs = kqlora::delta_rule_documents(exec, c.n, c.S, c.doc_start.data());
  Kokkos::View<int32_t**, Kokkos::LayoutRight, M> starts("starts", c.n, c.S);
  auto hs = Kokkos::create_mirror_view(starts);
  for (int64_t t = 0; t < T; ++t) hs(t / c.S, t % c.S) = c.doc_start[t];
  Kokkos::deep_copy(starts, hs);
  kqlora::GatedDeltaNetWeights<M> w{to_vector<M>(c.conv), to_vector<M>(c.a_log),
                                    to_vector<M>(c.dt_bias), to_vector<M>(c.norm)};
  const auto mixed = to_view<M>(c.mixed, T), z = to_view<M>(c.z, T), b = to_view<M>(c.b, T),
             a = to_view<M>(c.a, T);
  kqlora::GatedDeltaNetBuffers<M> buf;
  kqlora::Matrix<M> y("y", T, c.s.value_dim());
  kqlora::gated_deltanet_forward(exec, c.s, docs, c.S, kqlora::DocStarts<M>(starts), mixed, z, b, a,
                                 w, false, buf, y);
  Result r;
  r.y = to_doubles<M>(y);
  if (!dy) return r;
  kqlora::Matrix<M> dm("dm", T, c.s.conv_dim()), dz("dz", T, c.s.value_dim()),
      db("db", T, c.s.rule.value_heads), da("da", T, c.s.rule.value_heads);
  kqlora::gated_deltanet_backward(exec, c.s, docs, c.S, kqlora::DocStarts<M>(starts), mixed, z, a,
                                  w, false, buf, to_view<M>(*dy, T), dm, dz, db, da);
  r.d_mixed = to_doubles<M>(dm);
  r.dz = to_doubles<M>(dz);
  r.db = to_doubles<M>(db);
  r.da = to_doubles<M>(da);
  return r;
}

template <class T>
class GatedDeltaNet : public ::testing::Test {};
TYPED_TEST_SUITE(GatedDeltaNet, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

// Two rows of 140 tokens (chunks of 64, 64 and 12), unpacked, then row 0 packed as
// documents of 66 and 74 (the conv's window and the state both restart).
TYPED_TEST(GatedDeltaNet, ForwardMatchesTheFloat64Chain) {
  Case c = make_case(2, 140, 21);
  for (int packed = 0; packed < 2; ++packed) {
    if (packed)
      for (int64_t t = 66; t < 140; ++t) c.doc_start[t] = 66;
    const D ref = mixer(c);
    EXPECT_LE(max_diff(run<TypeParam>(c, nullptr).y, ref), 1e-5 * max_abs(ref))
        << (packed ? "packed" : "unpacked");
  }
}

// The gradients of L = sum(y . R) for the four projections' outputs against central
// differences of the float64 chain, on two rows of 80 tokens, row 1 packed (30 and 50).
TYPED_TEST(GatedDeltaNet, GradientsMatchFiniteDifferences) {
  Case c = make_case(2, 80, 22);
  for (int64_t t = 80 + 30; t < 160; ++t) c.doc_start[t] = 30;
  std::mt19937 gen(23);
  std::normal_distribution<double> normal;
  D R(static_cast<size_t>(c.T() * c.s.value_dim()));
  for (double& x : R) x = normal(gen);
  const Result got = run<TypeParam>(c, &R);
  const auto loss = [&](const Case& x) {
    const D y = mixer(x);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * R[i];
    return l;
  };
  const auto check = [&](D Case::*field, const D& grad, const char* name) {
    kqlora_test::expect_matches_central_differences(c, field, grad, name, loss);
  };
  check(&Case::mixed, got.d_mixed, "d mixed_qkv");
  check(&Case::z, got.dz, "dz");
  check(&Case::b, got.db, "db");
  check(&Case::a, got.da, "da");
}

}  // namespace
