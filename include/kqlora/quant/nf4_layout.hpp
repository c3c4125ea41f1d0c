#pragma once
// Shape and block sizes of an NF4 tensor, and the size rules they must follow.

#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/core/dtype.hpp"

namespace kqlora {

struct Nf4Layout {
  std::vector<int64_t> shape;  // 1-D or 2-D, row-major
  DType dtype = DType::float32;
  int64_t block_size = 64;
  int64_t scaler_block_size = 256;

  int64_t numel() const;
  int64_t num_blocks() const { return numel() / block_size; }
  /// Scaler blocks, the last one possibly partial.
  int64_t num_scaler_blocks() const {
    return (num_blocks() + scaler_block_size - 1) / scaler_block_size;
  }
  int64_t num_bytes() const { return numel() / 2; }

  /// Throws InputError naming the broken constraint (and `what`, e.g. a tensor's name).
  void validate(const std::string& what = "tensor") const;
  std::string shape_string() const;
};

bool operator==(const Nf4Layout& a, const Nf4Layout& b);
inline bool operator!=(const Nf4Layout& a, const Nf4Layout& b) {
  return !(a == b);
}

}  // namespace kqlora
