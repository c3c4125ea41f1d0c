#include "kqlora/core/bfloat16.hpp"

#include <cmath>
#include <initializer_list>

namespace kqlora {

bfloat16 bf16_from_double(double v) {
  if (std::isnan(v)) return bfloat16(static_cast<float>(v));
  // The float32 nearest to v is at most one bfloat16 step away from the answer: look at
  // that candidate and its two neighbours and keep the nearest (ties to an even mantissa).
  const bfloat16 c(static_cast<float>(v));
  bfloat16 best = c;
  double best_err = std::fabs(static_cast<double>(static_cast<float>(c)) - v);
  for (int d : {-1, 1}) {
    const uint16_t mag = c.bits & 0x7fffu;
    if ((d < 0 && mag == 0) || mag >= 0x7f80u) continue;  // no step across zero or past inf
    const bfloat16 n = bfloat16::from_bits(static_cast<uint16_t>(c.bits + d));
    const double err = std::fabs(static_cast<double>(static_cast<float>(n)) - v);
    if (err < best_err || (err == best_err && (n.bits & 1u) == 0)) {
      best = n;
      best_err = err;
    }
  }
  return best;
}

}  // namespace kqlora
