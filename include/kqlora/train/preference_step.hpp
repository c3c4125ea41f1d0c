#pragma once
// One micro-batch of a preference objective (train/preference_loss.hpp) through the model:
// pairs in rows 2i (chosen) and 2i + 1 (rejected). The reference's forward over the
// starting adapters (DPO), the policy's forward, each pair's terms, and the backward
// weighted by the loss's derivatives -- what the trainer's BatchLoader runs per
// micro-batch and the reference tests run on TRL's batch.

#include <cstdint>
#include <functional>
#include <vector>

#include "kqlora/nn/model.hpp"
#include "kqlora/train/preference_loss.hpp"

namespace kqlora {

/// ORPO scores the chosen rows' prompts too (TRL's cross-entropy over the whole chosen
/// sequence): row-major ids and labels [rows, T] on the host, the even rows' labels from
/// position 1 up to their first scored one set to the ids. Returns each row's prompt end
/// (that first scored position; 0 for the odd, rejected rows).
std::vector<int64_t> score_chosen_prompts(const int32_t* ids, int32_t* labels, int64_t rows,
                                          int64_t T);

/// The micro-batch's share of the loss (pairs: the global batch's pair count, chosen_tokens
/// ORPO's token count); its pairs' metrics added into `sums`. `reference` empty: no
/// reference forward (the objective needs none). `prompt_end`: score_chosen_prompts's
/// (ORPO), else null. With `grads`, the weighted backward after before_backward() (the
/// data-parallel hook), adding to the gradients with `accumulate`. `precomputed`: the
/// reference's log-probabilities of the batch's rows, precomputed (no reference forward).
template <class ExecSpace>
double preference_micro_batch(
    Model<ExecSpace>& model, const Batch<typename ExecSpace::memory_space>& b,
    const std::vector<int64_t>* prompt_end, const PreferenceConfig& objective,
    const typename Model<ExecSpace>::Vec& reference, double pairs, double chosen_tokens, bool grads,
    bool accumulate, PreferenceSums& sums, const std::function<void()>& before_backward = {},
    const std::vector<double>* precomputed = nullptr);

}  // namespace kqlora
