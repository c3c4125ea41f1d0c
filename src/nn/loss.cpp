#include "kqlora/nn/loss.hpp"

#include "kqlora/core/error.hpp"

namespace kqlora {

LossKind parse_loss(const std::string& s) {
  if (s == "mse") return LossKind::mse;
  if (s == "cross_entropy") return LossKind::cross_entropy;
  KQLORA_INPUT_CHECK(s == "sum", "loss: expected sum|mse|cross_entropy, got '" << s << "'");
  return LossKind::sum;
}

}  // namespace kqlora
