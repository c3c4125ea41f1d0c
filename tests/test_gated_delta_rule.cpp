// The gated delta rule (nn/gated_delta_rule.hpp) against its recurrent definition written
// out here in float64 (docs/MODELS.md, "Gated DeltaNet"): outputs over several chunks,
// grouped value heads and packed documents, each restarting the state; every input's
// gradient against central finite differences of the float64 form; and a 4096-token
// document against the recurrent form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "central_differences.hpp"
#include "exec_spaces.hpp"
#include "kqlora/nn/gated_delta_rule.hpp"

namespace {

using D = std::vector<double>;
using kqlora_test::max_abs;
using kqlora_test::max_diff;

struct Inputs {
  int64_t n = 0, S = 0;  // rows of S tokens
  kqlora::DeltaRuleShape s;
  D q, k, v, beta, g;           // [T, Hk dk], [T, Hk dk], [T, Hv dv], [T, Hv], [T, Hv]
  std::vector<int32_t> starts;  // per token: its document's first token (row index)
  int64_t T() const { return n * S; }
};

// q and k of unit length (as the layer's L2 norm leaves them; q then times dk^-1/2), beta in
// (0, 1), log decays in [-1.5, -0.005] with a few near 0 (slow decay over chunks).
Inputs random_inputs(int64_t n, int64_t S, kqlora::DeltaRuleShape s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  Inputs in;
  in.n = n;
  in.S = S;
  in.s = s;
  const int64_t T = n * S;
  const auto unit_rows = [&](D& x, int64_t heads, int64_t d, double scale) {
    x.resize(static_cast<size_t>(T * heads * d));
    for (int64_t r = 0; r < T * heads; ++r) {
      double len = 0;
      for (int64_t j = 0; j < d; ++j) len += std::pow(x[r * d + j] = normal(gen), 2);
      for (int64_t j = 0; j < d; ++j) x[r * d + j] *= scale / std::sqrt(len);
    }
  };
  unit_rows(in.q, s.key_heads, s.dk, 1.0 / std::sqrt(static_cast<double>(s.dk)));
  unit_rows(in.k, s.key_heads, s.dk, 1.0);
  in.v.resize(static_cast<size_t>(T * s.value_heads * s.dv));
  for (double& x : in.v) x = normal(gen);
  for (int64_t i = 0; i < T * s.value_heads; ++i) {
    in.beta.push_back(0.05 + 0.9 * uni(gen));
    in.g.push_back(uni(gen) < 0.2 ? -0.005 : -1.5 * uni(gen) - 0.005);
  }
  in.starts.resize(static_cast<size_t>(T));
  std::fill(in.starts.begin(), in.starts.end(), 0);  // (one document a row)
  return in;
}

// Documents from the listed starts of each row (the rest continue the one before).
void set_documents(Inputs& in, const std::vector<std::vector<int64_t>>& starts) {
  for (int64_t r = 0; r < in.n; ++r) {
    int32_t at = 0;
    for (int64_t t = 0; t < in.S; ++t) {
      if (std::find(starts[r].begin(), starts[r].end(), t) != starts[r].end())
        at = static_cast<int32_t>(t);
      in.starts[r * in.S + t] = at;
    }
  }
}

// The recurrent form in float64: O [T, Hv dv].
D recurrent(const Inputs& in) {
  const auto& s = in.s;
  const int64_t T = in.T(), H = s.value_heads, dk = s.dk, dv = s.dv, Kw = s.key_heads * dk;
  D O(static_cast<size_t>(T * H * dv), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kc = s.key_of(h) * dk;
    D S(static_cast<size_t>(dk * dv), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      if (in.starts[t] == t % in.S) std::fill(S.begin(), S.end(), 0.0);
      const double decay = std::exp(in.g[t * H + h]), b = in.beta[t * H + h];
      for (double& x : S) x *= decay;
      for (int64_t e = 0; e < dv; ++e) {
        double kv = 0;
        for (int64_t d = 0; d < dk; ++d) kv += S[d * dv + e] * in.k[t * Kw + kc + d];
        const double delta = b * (in.v[(t * H + h) * dv + e] - kv);
        for (int64_t d = 0; d < dk; ++d) S[d * dv + e] += in.k[t * Kw + kc + d] * delta;
      }
      for (int64_t e = 0; e < dv; ++e) {
        double o = 0;
        for (int64_t d = 0; d < dk; ++d) o += S[d * dv + e] * in.q[t * Kw + kc + d];
        O[(t * H + h) * dv + e] = o;
      }
    }
  }
  return O;
}

template <class M>
using Mat = Kokkos::View<float**, Kokkos::LayoutRight, M>;

template <class M>
Mat<M> to_view(const D& x, int64_t rows, int64_t cols) {
  Mat<M> out("x", rows, cols);
  auto h = Kokkos::create_mirror_view(out);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) h(i, j) = static_cast<float>(x[i * cols + j]);
  Kokkos::deep_copy(out, h);
  return out;
}

template <class M>
D to_doubles(const Mat<M>& x) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  D out;
  for (size_t i = 0; i < h.extent(0); ++i)
    for (size_t j = 0; j < h.extent(1); ++j) out.push_back(h(i, j));
  return out;
}

// The kernel's outputs, and with `dO` its gradients (dQ, dK per key head, dV, dbeta, dg).
template <class Exec>
struct Run {
  D O, dq, dk, dv, dbeta, dg;
};

template <class Exec>
Run<Exec> run_kernel(const Inputs& in, const D* dO) {
  using M = typename Exec::memory_space;
  const auto& s = in.s;
  const int64_t T = in.T(), Kw = s.key_heads * s.dk, Vw = s.value_heads * s.dv, H = s.value_heads;
  Exec exec;
  const auto docs = kqlora::delta_rule_documents(exec, in.n, in.S, in.starts.data());
  const auto Q = to_view<M>(in.q, T, Kw), K = to_view<M>(in.k, T, Kw), V = to_view<M>(in.v, T, Vw),
             B = to_view<M>(in.beta, T, H), G = to_view<M>(in.g, T, H);
  Mat<M> O("O", T, Vw);
  Kokkos::View<float*, M> states("states", docs.chunks * H * s.dk * s.dv);
  kqlora::gated_delta_rule_forward(exec, s, docs, Q, K, V, B, G, O, states);
  Run<Exec> r;
  r.O = to_doubles<M>(O);
  if (!dO) return r;
  Mat<M> dQv("dQv", T, H * s.dk), dKv("dKv", T, H * s.dk), dV("dV", T, Vw), dB("dB", T, H),
      dG("dG", T, H), dQ("dQ", T, Kw), dK("dK", T, Kw);
  kqlora::gated_delta_rule_backward(exec, s, docs, Q, K, V, B, G, states, to_view<M>(*dO, T, Vw),
                                    dQv, dKv, dV, dB, dG);
  kqlora::delta_rule_key_gradient(exec, s, dQv, dQ);
  kqlora::delta_rule_key_gradient(exec, s, dKv, dK);
  r.dq = to_doubles<M>(dQ);
  r.dk = to_doubles<M>(dK);
  r.dv = to_doubles<M>(dV);
  r.dbeta = to_doubles<M>(dB);
  r.dg = to_doubles<M>(dG);
  return r;
}

template <class T>
class GatedDeltaRule : public ::testing::Test {};
TYPED_TEST_SUITE(GatedDeltaRule, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

// Two rows of 150 tokens (chunks of 64, 64 and 22), two key heads each read by two value
// heads, dk 8 != dv 6: unpacked, then packed (documents of 66 and 84 tokens; of 30, 70 and
// 50), each document restarting the state. Within 1e-5 of the float64 form.
TYPED_TEST(GatedDeltaRule, ForwardMatchesTheRecurrentFormAcrossChunksAndDocuments) {
  Inputs in = random_inputs(2, 150, {2, 4, 8, 6}, 11);
  for (int packed = 0; packed < 2; ++packed) {
    if (packed) set_documents(in, {{0, 66}, {0, 30, 100}});
    const D ref = recurrent(in);
    const auto got = run_kernel<TypeParam>(in, nullptr);
    EXPECT_LE(max_diff(got.O, ref), 1e-5 * max_abs(ref)) << (packed ? "packed" : "unpacked");
  }
  // (the restart matters: without it the packed rows' outputs differ)
  Inputs whole = in;
  set_documents(whole, {{0}, {0}});
  EXPECT_GT(max_diff(recurrent(whole), recurrent(in)), 1e-2);
}

// Every gradient of L = sum(O . R) against central differences of the float64 form, over
// two rows of 140 tokens (one row packed as documents of 66 and 74: partial chunks both),
// a key head read by two value heads, dk 4, dv 3.
TYPED_TEST(GatedDeltaRule, GradientsMatchFiniteDifferences) {
  Inputs in = random_inputs(2, 140, {1, 2, 4, 3}, 12);
  set_documents(in, {{0, 66}, {0}});
  std::mt19937 gen(13);
  std::normal_distribution<double> normal;
  D R(static_cast<size_t>(in.T() * 2 * 3));
  for (double& x : R) x = normal(gen);
  const auto got = run_kernel<TypeParam>(in, &R);
  const auto loss = [&](const Inputs& x) {
    const D O = recurrent(x);
    double l = 0;
    for (size_t i = 0; i < O.size(); ++i) l += O[i] * R[i];
    return l;
  };
  const auto check = [&](D Inputs::*field, const D& grad, const char* name) {
    kqlora_test::expect_matches_central_differences(in, field, grad, name, loss);
  };
  check(&Inputs::q, got.dq, "dq");
  check(&Inputs::k, got.dk, "dk");
  check(&Inputs::v, got.dv, "dv");
  check(&Inputs::beta, got.dbeta, "dbeta");
  check(&Inputs::g, got.dg, "dg");
}

// One document of 4096 tokens (64 chunks, the state carried through all): within float32's
// accumulated rounding of the float64 form (2e-5 of the outputs' largest).
TYPED_TEST(GatedDeltaRule, LongDocumentStaysWithinFloat32OfTheRecurrentForm) {
  const Inputs in = random_inputs(1, 4096, {1, 1, 16, 16}, 14);
  const D ref = recurrent(in);
  const auto got = run_kernel<TypeParam>(in, nullptr);
  const double diff = max_diff(got.O, ref);
  std::printf("4096 tokens: max |O - O_float64| = %.3g (max |O| %.3g)\n", diff, max_abs(ref));
  EXPECT_LE(diff, 2e-5 * max_abs(ref));
}

}  // namespace
