#pragma once
// The paired preference objectives on sequence log-probabilities, as TRL 1.16 computes them
// (docs/TRAINING.md, "Preference training"): DPO (DPOTrainer: loss_type sigmoid, hinge, ipo,
// robust), SimPO (CPOTrainer with loss_type "simpo", cpo_alpha 0) and ORPO (ORPOTrainer).
// Each pair gives its share of the step's loss and the loss's derivatives with respect to
// the policy's summed log-probabilities of its chosen and rejected completions: the model's
// backward turns those into gradients (nn/model.hpp, backward_weighted). All in double.
//
// For a pair with policy log-probability sums c, r over n_c, n_r scored tokens and, for
// DPO, the reference's c0, r0 (beta b, label smoothing e, P pairs in the global batch):
//   DPO      d = (c - c0) - (r - r0)
//            sigmoid  -logsigmoid(b d)
//            hinge    relu(1 - b d)
//            ipo      ((c - c0) / n_c - (r - r0) / n_r - 1 / (2 b))^2
//            robust   (-(1 - e) logsigmoid(b d) + e logsigmoid(-b d)) / (1 - 2 e)
//            rewards  b (c - c0), b (r - r0)
//   SimPO    u = c / n_c - r / n_r - gamma / b;
//            -(1 - e) logsigmoid(b u) - e logsigmoid(-b u); rewards b c / n_c, b r / n_r
//   ORPO     a_c = c / n_c, a_r = r / n_r; log_odds = (a_c - a_r) - (log1mexp(a_c) -
//            log1mexp(a_r)); the pair's -b logsigmoid(log_odds), plus the chosen rows'
//            cross-entropy over all their tokens, the prompt's too (TRL's ORPOTrainer:
//            "computed over the full prompt and response"): sum_chosen -(c + p) / N, p the
//            prompt tokens' log-probabilities, N the global batch's chosen tokens from
//            position 1 (PyTorch's CrossEntropyLoss means over them); rewards b a_c, b a_r
// and every pair's loss is divided by P (TRL's mean over the batch).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kqlora {

struct PreferenceConfig {
  std::string objective = "dpo";      // dpo, simpo, orpo
  std::string loss_type = "sigmoid";  // dpo: sigmoid, hinge, ipo, robust
  double beta = 0.1;
  double label_smoothing = 0.0;  // robust DPO, SimPO
  double simpo_gamma = 0.5;
};

/// One pair's log-probability sums and scored-token counts (the reference's: DPO).
struct PairLogps {
  double chosen = 0, rejected = 0;
  int64_t chosen_tokens = 0, rejected_tokens = 0;
  double ref_chosen = 0, ref_rejected = 0;
  double chosen_prompt = 0;  // ORPO: the chosen row's prompt tokens' (positions 1 ..)
};

/// One pair's share of the step (divided by the global pair count already) and what its
/// metrics read (TRL's names, docs/TRAINING.md).
struct PairTerms {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // d loss / d (the policy's summed log-probabilities)
  double d_chosen_prompt = 0;           // ORPO: d loss / d chosen_prompt
  double reward_chosen = 0, reward_rejected = 0;
  double logp_chosen = 0,
         logp_rejected = 0;  // logps/chosen, logps/rejected (averages: SimPO, ORPO)
  double nll = 0;            // ORPO's nll_loss share
  double log_odds_ratio = 0, log_odds_chosen = 0;  // ORPO's, each pair's
};

/// The metrics' sums over pairs (a step's, over every rank: the log shows their means over
/// `pairs`; TRL's names in docs/TRAINING.md).
struct PreferenceSums {
  static constexpr int kCount = 10;
  // pairs, rewards/chosen, rewards/rejected, rewards/accuracies (chosen > rejected, strict),
  // rewards/margins, logps/chosen, logps/rejected, nll_loss, log_odds_ratio, log_odds_chosen
  double v[kCount] = {};
  void add(const PairTerms& t);
  /// (name, mean over the pairs) of the objective's metrics, TRL's names; nll_loss is a
  /// sum of shares already.
  std::vector<std::pair<std::string, double>> means(const PreferenceConfig& c) const;
};

/// Whether the objective compares against a reference (DPO: its forward or its precomputed
/// log-probabilities).
bool needs_reference(const PreferenceConfig& c);

/// The pair's terms; `pairs` the global batch's pair count, `chosen_tokens` its scored
/// chosen tokens (ORPO's cross-entropy).
PairTerms preference_pair(const PreferenceConfig& c, const PairLogps& p, double pairs,
                          double chosen_tokens);

}  // namespace kqlora
