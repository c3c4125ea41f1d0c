#include "kqlora/train/preference_loss.hpp"

#include <algorithm>
#include <cmath>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace {

double sigmoid(double x) {
  return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
}

/// log(sigmoid(x)) without overflow: -softplus(-x).
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

/// log(1 - e^x) for x < 0, accurate on either side of -log 2.
double log1mexp(double x) {
  return x > -M_LN2 ? std::log(-std::expm1(x)) : std::log1p(-std::exp(x));
}

double tokens(int64_t n) {
  return static_cast<double>(std::max<int64_t>(n, 1));  // (TRL clamps to 1)
}

}  // namespace

void PreferenceSums::add(const PairTerms& t) {
  const double x[kCount] = {1,
                            t.reward_chosen,
                            t.reward_rejected,
                            t.reward_chosen > t.reward_rejected ? 1.0 : 0.0,
                            t.reward_chosen - t.reward_rejected,
                            t.logp_chosen,
                            t.logp_rejected,
                            t.nll,
                            t.log_odds_ratio,
                            t.log_odds_chosen};
  for (int i = 0; i < kCount; ++i) v[i] += x[i];
}

std::vector<std::pair<std::string, double>> PreferenceSums::means(const PreferenceConfig& c) const {
  const double n = v[0] > 0 ? v[0] : 1;
  std::vector<std::pair<std::string, double>> out = {
      {"rewards/chosen", v[1] / n},     {"rewards/rejected", v[2] / n},
      {"rewards/accuracies", v[3] / n}, {"rewards/margins", v[4] / n},
      {"logps/chosen", v[5] / n},       {"logps/rejected", v[6] / n}};
  if (c.objective == "orpo") {
    out.emplace_back("nll_loss", v[7]);
    out.emplace_back("log_odds_ratio", v[8] / n);
    out.emplace_back("log_odds_chosen", v[9] / n);
  }
  return out;
}

bool needs_reference(const PreferenceConfig& c) {
  return c.objective == "dpo";
}

PairTerms preference_pair(const PreferenceConfig& c, const PairLogps& p, double pairs,
                          double chosen_tokens) {
  PairTerms t;
  const double b = c.beta, e = c.label_smoothing;
  const double nc = tokens(p.chosen_tokens), nr = tokens(p.rejected_tokens);
  double dc = 0, dr = 0;  // d (the pair's loss) / d c, d r, before the mean over pairs
  if (c.objective == "dpo") {
    const double lc = p.chosen - p.ref_chosen, lr = p.rejected - p.ref_rejected, d = lc - lr;
    double dd = 0;
    if (c.loss_type == "sigmoid") {
      t.loss = -log_sigmoid(b * d);
      dd = -b * sigmoid(-b * d);
    } else if (c.loss_type == "hinge") {
      t.loss = std::max(0.0, 1 - b * d);
      dd = 1 - b * d > 0 ? -b : 0.0;  // (relu's derivative at 0: 0, as torch's)
    } else if (c.loss_type == "ipo") {
      const double q = lc / nc - lr / nr - 1 / (2 * b);
      t.loss = q * q;
      dc = 2 * q / nc;
      dr = -2 * q / nr;
    } else if (c.loss_type == "robust") {
      t.loss = (-(1 - e) * log_sigmoid(b * d) + e * log_sigmoid(-b * d)) / (1 - 2 * e);
      dd = (-(1 - e) * b * sigmoid(-b * d) - e * b * sigmoid(b * d)) / (1 - 2 * e);
    } else {
      KQLORA_INPUT_CHECK(false, "loss_type '" << c.loss_type << "' is not one of sigmoid, hinge, "
                                              << "ipo, robust");
    }
    if (c.loss_type != "ipo") {
      dc = dd;
      dr = -dd;
    }
    t.reward_chosen = b * lc;
    t.reward_rejected = b * lr;
    t.logp_chosen = p.chosen;
    t.logp_rejected = p.rejected;
  } else if (c.objective == "simpo") {
    const double ac = p.chosen / nc, ar = p.rejected / nr, u = ac - ar - c.simpo_gamma / b;
    t.loss = -(1 - e) * log_sigmoid(b * u) - e * log_sigmoid(-b * u);
    const double du = -(1 - e) * b * sigmoid(-b * u) + e * b * sigmoid(b * u);
    dc = du / nc;
    dr = -du / nr;
    t.reward_chosen = b * ac;
    t.reward_rejected = b * ar;
    t.logp_chosen = ac;
    t.logp_rejected = ar;
  } else if (c.objective == "orpo") {
    const double ac = p.chosen / nc, ar = p.rejected / nr;
    const double lo = (ac - ar) - (log1mexp(ac) - log1mexp(ar));
    t.loss = -b * log_sigmoid(lo);
    const double dlo = -b * sigmoid(-lo);
    // (d lo / d a = 1 / (1 - e^a) for the chosen, -1 / (1 - e^a) for the rejected)
    dc = dlo / -std::expm1(ac) / nc;
    dr = -dlo / -std::expm1(ar) / nr;
    t.reward_chosen = b * ac;
    t.reward_rejected = b * ar;
    t.logp_chosen = ac;
    t.logp_rejected = ar;
    t.log_odds_ratio = log_sigmoid(lo);
    t.log_odds_chosen = lo;
  } else {
    KQLORA_INPUT_CHECK(false, "objective '" << c.objective << "' is not a paired preference "
                                            << "objective (dpo, simpo, orpo)");
  }
  t.loss /= pairs;
  t.d_chosen = dc / pairs;
  t.d_rejected = dr / pairs;
  if (c.objective == "orpo") {  // the chosen rows' cross-entropy, over the batch's tokens
    t.nll = -(p.chosen + p.chosen_prompt) / chosen_tokens;
    t.loss += t.nll;
    t.d_chosen += -1 / chosen_tokens;
    t.d_chosen_prompt = -1 / chosen_tokens;
  }
  return t;
}

}  // namespace kqlora
