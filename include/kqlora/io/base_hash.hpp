#pragma once
// The identity of a model's frozen base (docs/CHECKPOINTS.md, "checkpoint_base"): one
// ContentHash over, in table order, every NF4 entry's name, layout and components and
// every frozen dense entry's name and values. A checkpoint written with
// checkpoint_base = auto stores it in place of the base.

#include <functional>
#include <string>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/io/checkpoint_contents.hpp"

namespace kqlora {

struct FloatSpan {
  const float* data = nullptr;
  int64_t size = 0;
  /// Or bfloat16 values (a compact tensor), hashed as the float32 values they widen to.
  const bfloat16* bf16 = nullptr;
};

/// The hash, with the tensors from the callbacks.
std::string base_hash(const ParamTable& table,
                      const std::function<Nf4Tensor<Kokkos::HostSpace>(const ParamEntry&)>& nf4,
                      const std::function<FloatSpan(const ParamEntry&)>& dense);

/// The hash of whole contents that hold their base (assembled FSDP shards); InputError
/// naming `where` when a tensor is missing.
std::string base_hash(const CheckpointContents& c, const std::string& where);

}  // namespace kqlora
