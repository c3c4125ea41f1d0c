// The optimizers against PyTorch's documented update rules, written here in float64 from
// torch.optim's formulas (SGD with momentum and L2 weight decay; Adam with L2 weight decay;
// AdamW with decoupled decay), three steps each so that the momentum buffer's first step
// and the bias corrections of later steps are covered.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kqlora/optim/optimizer.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Vec = kqlora::Optimizer<Exec>::Vec;
using Kind = kqlora::OptimizerConfig::Kind;

struct Reference {  // float64, element by element
  std::vector<double> p, buf, m, v;
  std::vector<double> mag;  // the largest |term| a state summed: its rounding's scale
};

void reference_step(const kqlora::OptimizerConfig& c, int t, double lr,
                    const std::vector<double>& g, Reference& r) {
  for (size_t i = 0; i < g.size(); ++i) {
    double d = g[i];
    if (c.kind != Kind::adamw && c.weight_decay != 0) d += c.weight_decay * r.p[i];
    r.mag[i] = std::max({r.mag[i], std::fabs(g[i]), std::fabs(d)});
    if (c.kind == Kind::sgd) {
      if (c.momentum != 0) {
        r.buf[i] = t == 1 ? d : c.momentum * r.buf[i] + d;
        d = r.buf[i];
      }
      r.p[i] -= lr * d;
      continue;
    }
    if (c.kind == Kind::adamw) r.p[i] *= 1 - lr * c.weight_decay;
    r.m[i] = c.beta1 * r.m[i] + (1 - c.beta1) * d;
    r.v[i] = c.beta2 * r.v[i] + (1 - c.beta2) * d * d;
    const double mhat = r.m[i] / (1 - std::pow(c.beta1, t));
    const double vhat = r.v[i] / (1 - std::pow(c.beta2, t));
    r.p[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
  }
}

void check(const kqlora::OptimizerConfig& c, const char* what) {
  const int64_t n = 1000;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::vector<float> p0(n);
  for (auto& x : p0) x = normal(gen);
  Vec p("p", n), g("g", n);
  auto hp = Kokkos::create_mirror_view(p), hg = Kokkos::create_mirror_view(g);
  for (int64_t i = 0; i < n; ++i) hp(i) = p0[i];
  Kokkos::deep_copy(p, hp);
  Reference r{std::vector<double>(p0.begin(), p0.end()), std::vector<double>(n),
              std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  kqlora::Optimizer<Exec> opt(Exec(), c, n);
  const double lrs[3] = {1e-2, 5e-3, 2e-2};  // a schedule changes lr between steps
  for (int t = 1; t <= 3; ++t) {
    std::vector<double> gd(n);
    for (int64_t i = 0; i < n; ++i) {
      // Gradients of several sizes, some tiny (where Adam's eps matters).
      hg(i) = normal(gen) * (i % 10 == 0 ? 1e-7f : 1.0f);
      gd[i] = hg(i);
    }
    Kokkos::deep_copy(g, hg);
    opt.step(p, g, lrs[t - 1]);
    reference_step(c, t, lrs[t - 1], gd, r);
  }
  EXPECT_EQ(opt.steps(), 3);
  Kokkos::deep_copy(hp, p);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(hp(i), r.p[i], 1e-6 * std::fabs(r.p[i]) + 1e-7) << what << " p[" << i << "]";
  for (const auto& [name, view] : opt.state()) {
    const bool squares = name == "exp_avg_sq";
    const auto& ref = name == "momentum_buffer" ? r.buf : squares ? r.v : r.m;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    // float32 rounding of sums whose terms may cancel: relative to the terms.
    for (int64_t i = 0; i < n; ++i) {
      const double scale = squares ? r.mag[i] * r.mag[i] : r.mag[i];
      ASSERT_NEAR(h(i), ref[i], 1e-6 * (std::fabs(ref[i]) + scale))
          << what << " " << name << "[" << i << "]";
    }
  }
}

}  // namespace

TEST(Optimizer, SgdWithMomentumMatchesTorchsRule) {
  kqlora::OptimizerConfig c;
  c.kind = Kind::sgd;
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  check(c, "sgd");
  c.momentum = 0;
  check(c, "sgd without momentum");
}

TEST(Optimizer, AdamMatchesTorchsRule) {
  kqlora::OptimizerConfig c;
  c.kind = Kind::adam;
  check(c, "adam");
  c.weight_decay = 0.01;  // L2: added to the gradient
  check(c, "adam with weight decay");
}

TEST(Optimizer, AdamWMatchesTorchsRule) {
  kqlora::OptimizerConfig c;
  c.kind = Kind::adamw;
  c.weight_decay = 0.1;  // decoupled: the weights shrink before the update
  c.beta2 = 0.95;
  check(c, "adamw");
}
