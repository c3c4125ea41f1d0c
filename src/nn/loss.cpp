#include "kqlora/nn/loss.hpp"

#include "kqlora/core/error.hpp"

namespace kqlora {

LossKind parse_loss(const std::string& s) {
  if (s == "mse") return LossKind::mse;
  KQLORA_INPUT_CHECK(s == "sum", "loss: expected sum|mse, got '" << s << "'");
  return LossKind::sum;
}

}  // namespace kqlora
