#include "kqlora/train/preference_step.hpp"

namespace kqlora {

std::vector<int64_t> score_chosen_prompts(const int32_t* ids, int32_t* labels, int64_t rows,
                                          int64_t T) {
  std::vector<int64_t> end(static_cast<size_t>(rows), 0);
  for (int64_t i = 0; i < rows; i += 2) {
    int32_t* l = labels + i * T;
    int64_t f = 1;
    while (f < T && l[f] == kIgnoreLabel) ++f;
    end[static_cast<size_t>(i)] = f;
    for (int64_t t = 1; t < f; ++t) l[t] = ids[i * T + t];
  }
  return end;
}

template <class ExecSpace>
double preference_micro_batch(Model<ExecSpace>& model,
                              const Batch<typename ExecSpace::memory_space>& b,
                              const std::vector<int64_t>* prompt_end,
                              const PreferenceConfig& objective,
                              const typename Model<ExecSpace>::Vec& reference, double pairs,
                              double chosen_tokens, bool grads, bool accumulate,
                              PreferenceSums& sums, const std::function<void()>& before_backward,
                              const std::vector<double>* precomputed) {
  const size_t rows = b.tokens.extent(0);
  std::vector<double> ref(rows, 0.0);
  if (precomputed) {
    ref = *precomputed;
  } else if (reference.data()) {  // (the frozen reference: the base with the starting adapters)
    model.use_weights(reference);
    ref = model.sequence_logps(b, false);
    model.use_masters();
  }
  std::vector<int64_t> scored;
  std::vector<double> prompt;  // (ORPO: the chosen rows' prompt log-probabilities)
  const std::vector<double> logp =
      model.sequence_logps(b, grads, &scored, prompt_end, prompt_end ? &prompt : nullptr);
  std::vector<double> w(rows), wp(rows, 0.0);
  double loss = 0.0;
  for (size_t c = 0; c + 1 < rows; c += 2) {
    const size_t r = c + 1;
    PairLogps p{logp[c], logp[r], scored[c], scored[r], ref[c], ref[r]};
    if (prompt_end) p.chosen_prompt = prompt[c];
    const PairTerms t = preference_pair(objective, p, pairs, chosen_tokens);
    loss += t.loss;
    sums.add(t);
    w[c] = t.d_chosen;
    w[r] = t.d_rejected;
    wp[c] = t.d_chosen_prompt;
  }
  if (grads) {
    if (before_backward) before_backward();
    model.backward_weighted(w, accumulate, prompt_end ? &wp : nullptr);
  }
  return loss;
}

template double preference_micro_batch(Model<Kokkos::DefaultExecutionSpace>&,
                                       const Batch<Kokkos::DefaultExecutionSpace::memory_space>&,
                                       const std::vector<int64_t>*, const PreferenceConfig&,
                                       const Model<Kokkos::DefaultExecutionSpace>::Vec&, double,
                                       double, bool, bool, PreferenceSums&,
                                       const std::function<void()>&, const std::vector<double>*);

}  // namespace kqlora
