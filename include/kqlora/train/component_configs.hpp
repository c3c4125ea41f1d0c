#pragma once
// The run configuration (the deck) split into the small configurations of the model and
// the optimizer: nn/ and optim/ know nothing of the deck (docs/ARCHITECTURE.md).

#include "kqlora/io/deck.hpp"
#include "kqlora/nn/model_config.hpp"
#include "kqlora/optim/optimizer.hpp"

namespace kqlora {

ModelConfig model_config(const Config& c);
OptimizerConfig optimizer_config(const Config& c);

}  // namespace kqlora
