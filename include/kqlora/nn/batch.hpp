#pragma once
// A micro-batch as a model reads it: float rows (and their targets) or token ids (and
// their labels), with the keys of its dropout masks. Which one a model takes, and of what
// width, is its InputSpec.

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kqlora/core/blas.hpp"

namespace kqlora {

/// Token ids or labels, row-major [sequences, positions]; label -100 is ignored.
template <class MemSpace>
using TokenMatrix = Kokkos::View<int32_t**, Kokkos::LayoutRight, MemSpace>;

constexpr int32_t kIgnoreLabel = -100;

struct InputSpec {
  bool tokens = false;
  int64_t features = 0;         // float rows: the input's width
  int64_t target_features = 0;  // float rows: the targets' width (0: no targets)
  int64_t seq_len = 0;          // tokens: positions per sequence
  int64_t vocab = 0;            // tokens: ids are < vocab
  int64_t rows_per_sample = 1;  // tokens: a sample's rows (2: a preference pair's chosen,
                                //   rejected; docs/MODELS.md, "Data files")
};

template <class MemSpace>
struct Batch {
  Matrix<MemSpace> inputs, targets;      // float rows [n, features], [n, target_features]
  TokenMatrix<MemSpace> tokens, labels;  // token ids [n, seq_len]
  TokenMatrix<MemSpace> positions;       // tokens: position_ids [n, seq_len] of packed rows, whose
                                         //   documents never see each other (empty: one a row)
  int64_t step = 0, first_sample = 0;    // dropout keys: the step and the global index
  int64_t global_bs = 1;                 //   of the first sample, the global batch size
  int64_t row_len = 0;  // tokens: the data file's row length, when the batch's rows are
                        //   trimmed shorter (0: not trimmed); dropout keys count with it
};

}  // namespace kqlora
