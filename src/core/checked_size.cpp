#include "kqlora/core/checked_size.hpp"

#include <sstream>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  KQLORA_INPUT_CHECK(a >= 0 && b >= 0, what << ": negative size " << a << " x " << b);
  int64_t p = 0;
  KQLORA_INPUT_CHECK(!__builtin_mul_overflow(a, b, &p) && p <= kMaxElements,
                     what << ": " << a << " x " << b << " is too large (more than 2^48)");
  return p;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  KQLORA_INPUT_CHECK(a >= 0 && b >= 0, what << ": negative size " << a << " + " << b);
  KQLORA_INPUT_CHECK(a <= kMaxElements && b <= kMaxElements - a,
                     what << ": " << a << " + " << b << " is too large (more than 2^48)");
  return a + b;
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    KQLORA_INPUT_CHECK(d >= 0, what << ": negative dimension in shape " << shape_text(shape));
    KQLORA_INPUT_CHECK(
        !__builtin_mul_overflow(n, d, &n) && n <= kMaxElements,
        what << ": shape " << shape_text(shape) << " has too many elements (more than 2^48)");
  }
  return n;
}

}  // namespace kqlora
