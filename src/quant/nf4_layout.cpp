#include "kqlora/quant/nf4_layout.hpp"

#include <sstream>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"

namespace kqlora {

int64_t Nf4Layout::numel() const {
  return checked_numel_of(shape, [&] { return "NF4 tensor"; });
}

std::string Nf4Layout::shape_string() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

void Nf4Layout::validate(const std::string& what) const {
  KQLORA_INPUT_CHECK(shape.size() == 1 || shape.size() == 2,
                     what << ": NF4 needs a 1-D or 2-D tensor, got " << shape.size()
                          << " dimensions " << shape_string());
  for (int64_t d : shape) {
    KQLORA_INPUT_CHECK(d > 0, what << ": NF4 needs positive dimensions, got " << shape_string());
  }
  KQLORA_INPUT_CHECK(block_size > 0 && block_size % 2 == 0,
                     what << ": block_size must be a positive even number (two codes per "
                             "byte, whole bytes per block), got "
                          << block_size);
  KQLORA_INPUT_CHECK(scaler_block_size > 0,
                     what << ": scaler_block_size must be positive, got " << scaler_block_size);
  KQLORA_INPUT_CHECK(numel() % block_size == 0,
                     what << ": numel " << numel() << " of shape " << shape_string()
                          << " is not a multiple of block_size " << block_size);
}

bool operator==(const Nf4Layout& a, const Nf4Layout& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.block_size == b.block_size &&
         a.scaler_block_size == b.scaler_block_size;
}

}  // namespace kqlora
