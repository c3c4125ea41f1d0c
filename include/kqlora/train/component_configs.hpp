#pragma once
// The run configuration (the deck) split into the small configurations of the model, the
// optimizer and the data-parallel strategy: nn/, optim/ and parallel/ know nothing of the
// deck (docs/ARCHITECTURE.md).

#include "kqlora/nn/model_config.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/parallel/data_parallel.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

ModelConfig model_config(const Config& c);
OptimizerConfig optimizer_config(const Config& c);
/// `fresh`: a run that starts from its initialisation (not a restart).
DataParallelConfig data_parallel_config(const Config& c, bool fresh);

}  // namespace kqlora
