#include "kqlora/core/non_finite.hpp"

#include <algorithm>
#include <cmath>

#include "kqlora/core/error.hpp"

namespace kqlora {

void refuse_non_finite(const float* v, int64_t n, int64_t first, const std::vector<int64_t>& shape,
                       const std::string& where) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(v[i])) continue;
    std::string at;
    for (int64_t k = static_cast<int64_t>(shape.size()) - 1, rest = first + i; k >= 0; --k) {
      at = std::to_string(rest % std::max<int64_t>(shape[k], 1)) + (at.empty() ? "" : ", ") + at;
      rest /= std::max<int64_t>(shape[k], 1);
    }
    KQLORA_INPUT_CHECK(false, where << " holds " << (std::isnan(v[i]) ? "NaN" : "an infinity")
                                    << " at [" << at
                                    << "]: a model's weights must be finite (a damaged or "
                                       "overflowed file?)");
  }
}

}  // namespace kqlora
