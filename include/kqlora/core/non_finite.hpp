#pragma once
// Weights read from a user's file must be finite (docs/RELIABILITY.md, "Runs that learn
// nothing"): a NaN or an infinity in a base tensor would train or export silently.

#include <cstdint>
#include <string>
#include <vector>

namespace kqlora {

/// InputError "<where> holds NaN at [i, j]" (or "an infinity") at the first of n values
/// that is not finite; `first` is the flat index of v[0] in a tensor of `shape`.
void refuse_non_finite(const float* v, int64_t n, int64_t first, const std::vector<int64_t>& shape,
                       const std::string& where);

}  // namespace kqlora
