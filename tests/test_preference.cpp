// The paired preference objectives' per-pair terms (train/preference_loss.hpp): each
// derivative against a central finite difference of the loss in double, and values a hand
// computation gives (TRL's own numbers are the reference tests').
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/train/preference_loss.hpp"

namespace {

using kqlora::PairLogps;
using kqlora::PreferenceConfig;

std::vector<PreferenceConfig> objectives() {
  std::vector<PreferenceConfig> v;
  for (const char* t : {"sigmoid", "hinge", "ipo", "robust"}) {
    PreferenceConfig c;
    c.loss_type = t;
    c.beta = 0.3;
    c.label_smoothing = std::string(t) == "robust" ? 0.1 : 0.0;
    v.push_back(c);
  }
  PreferenceConfig s;
  s.objective = "simpo";
  s.beta = 2.0;
  s.label_smoothing = 0.05;
  s.simpo_gamma = 0.7;
  v.push_back(s);
  PreferenceConfig o;
  o.objective = "orpo";
  o.beta = 0.25;
  v.push_back(o);
  return v;
}

TEST(PreferenceLoss, DerivativesMatchFiniteDifferences) {
  const double P = 4, N = 37;
  for (const PreferenceConfig& c : objectives())
    for (const PairLogps& p :
         {PairLogps{-12.5, -15.25, 7, 9, -13.0, -14.0}, PairLogps{-30.0, -8.0, 11, 3, -29.0, -9.5},
          PairLogps{-2.5, -2.25, 2, 2, -2.0, -2.75}}) {
      const auto t = kqlora::preference_pair(c, p, P, N);
      const double h = 1e-5;
      auto at = [&](double dc, double dr) {
        PairLogps q = p;
        q.chosen += dc;
        q.rejected += dr;
        return kqlora::preference_pair(c, q, P, N).loss;
      };
      const std::string what = c.objective + "/" + c.loss_type + " at " + std::to_string(p.chosen);
      EXPECT_NEAR(t.d_chosen, (at(h, 0) - at(-h, 0)) / (2 * h), 1e-7) << what;
      EXPECT_NEAR(t.d_rejected, (at(0, h) - at(0, -h)) / (2 * h), 1e-7) << what;
      EXPECT_TRUE(std::isfinite(t.loss)) << what;
    }
}

TEST(PreferenceLoss, ValuesByHand) {
  PreferenceConfig dpo;  // (TRL's defaults: beta 0.1, sigmoid)
  // d = (c - c0) - (r - r0) = 0: log 2 a pair, over 2 pairs; rewards beta (c - c0)
  auto t = kqlora::preference_pair(dpo, {-10, -12, 5, 6, -11, -13}, 2, 1);
  EXPECT_NEAR(t.loss, std::log(2.0) / 2, 1e-15);
  EXPECT_NEAR(t.reward_chosen, 0.1, 1e-15);
  EXPECT_NEAR(t.reward_rejected, 0.1, 1e-15);
  EXPECT_NEAR(t.d_chosen, -0.1 * 0.5 / 2, 1e-15);  // -beta sigmoid(0) / pairs
  dpo.loss_type = "hinge";                         // relu(1 - 0.1 * 5) with d = 5
  EXPECT_NEAR(kqlora::preference_pair(dpo, {-5, -10, 1, 1, 0, 0}, 1, 1).loss, 0.5, 1e-15);
  dpo.loss_type = "ipo";  // ((c - c0) / n_c - (r - r0) / n_r - 1 / (2 beta))^2 = (2 + 1 - 5)^2
  EXPECT_NEAR(kqlora::preference_pair(dpo, {-4, -6, 2, 6, -8, 0}, 1, 1).loss, 4.0, 1e-12);
  PreferenceConfig simpo;
  simpo.objective = "simpo";
  simpo.beta = 2;
  simpo.simpo_gamma = 1;  // u = -1 - (-2) - 0.5 = 0.5: -logsigmoid(1)
  t = kqlora::preference_pair(simpo, {-4, -8, 4, 4}, 1, 1);
  EXPECT_NEAR(t.loss, std::log1p(std::exp(-1.0)), 1e-14);
  EXPECT_NEAR(t.reward_chosen, -2.0, 1e-15);
  EXPECT_NEAR(t.logp_rejected, -2.0, 1e-15);
  PreferenceConfig orpo;
  orpo.objective = "orpo";  // equal averages: log odds 0, -beta log(1/2); nll -c / N
  t = kqlora::preference_pair(orpo, {-3, -1, 3, 1}, 1, 6);
  EXPECT_NEAR(t.log_odds_chosen, 0, 1e-15);
  EXPECT_NEAR(t.loss, 0.1 * std::log(2.0) + 0.5, 1e-14);
  EXPECT_NEAR(t.nll, 0.5, 1e-15);
  EXPECT_THROW(kqlora::preference_pair(PreferenceConfig{"kto"}, {}, 1, 1), kqlora::InputError);
  EXPECT_TRUE(kqlora::needs_reference(PreferenceConfig{}));
  EXPECT_FALSE(kqlora::needs_reference(simpo));
}

}  // namespace
