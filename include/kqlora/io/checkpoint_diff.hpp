#pragma once
// Parameter-by-parameter comparison of checkpoints (kqlora-diff): NF4 components bitwise,
// float tensors elementwise with |test - ref| <= atol + rtol * |ref| (numpy.allclose, the
// upstream DDP test's check).

#include <string>
#include <vector>

#include "kqlora/io/checkpoint.hpp"

namespace kqlora {

struct DiffOptions {
  double rtol = 1e-4, atol = 1e-4;
  bool equal_nan = false;
  bool optimizer = false;  // compare the optimizer state too
};

struct DiffLine {
  std::string name;  // parameter (or optimizer/<param>/<state>)
  std::string kind;  // "nf4", "float", "missing", "extra", "shape"
  bool equal = true;
  double max_abs = 0, max_rel = 0;  // float tensors
  std::string detail;               // what differs, for NF4 and structural problems
};

/// Compares `test` with `ref`; one line per parameter of either.
std::vector<DiffLine> diff_checkpoints(const CheckpointContents& ref,
                                       const CheckpointContents& test, const DiffOptions& options);

}  // namespace kqlora
