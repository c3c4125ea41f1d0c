#pragma once
// The training loop of kqlora-train, top to bottom per step: data, forward, loss,
// backward, gradient reduction over ranks, gradient norm (non-finite check, clipping),
// optimizer update, logging, evaluation, checkpoint.

#include <iosfwd>
#include <string>
#include <vector>

#include "kqlora/io/deck.hpp"

namespace kqlora {

struct TrainSummary {
  std::vector<double> losses;  // per step (NaN for a skipped step)
  int64_t steps_done = 0, steps_skipped = 0;
  std::string last_checkpoint;
};

/// Runs the configured training on every rank of the run; progress goes to `log` on rank 0.
/// Throws InputError for bad input and Error for failures (a non-finite loss with
/// nonfinite = stop among them).
TrainSummary train(const Config& cfg, std::ostream& log);

}  // namespace kqlora
