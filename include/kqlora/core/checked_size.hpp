#pragma once
// Size arithmetic on sizes that come from input (deck keys, shapes and attributes in files,
// command-line sizes): every product and sum is overflow-checked and bounded, so a crafted
// size is refused naming it (InputError) instead of wrapping into a number that passes the
// next check (docs/RELIABILITY.md).

#include <cstdint>
#include <string>
#include <vector>

namespace kqlora {

/// The most elements one tensor (or one buffer) may have: 2^48, far beyond any memory, so
/// that its size in bytes for any element type, and sums of a few such sizes, stay in int64.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

/// a * b for non-negative a, b; InputError "<what>: ... is too large" when the product
/// exceeds kMaxElements (or a factor is negative).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);
/// a + b for non-negative a, b, with the same bound.
int64_t checked_add(int64_t a, int64_t b, const std::string& what);
/// The product of a shape's dimensions (1 for no dimensions); each must be >= 0 and the
/// product <= kMaxElements, else InputError naming `what` and the shape.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what);
/// checked_numel for hot paths: `what()` (giving the name) is called only when it fails.
template <class What>
int64_t checked_numel_of(const std::vector<int64_t>& shape, What&& what) {
  int64_t n = 1;
  bool ok = true;
  for (int64_t d : shape)
    ok = ok && d >= 0 && !__builtin_mul_overflow(n, d, &n) && n <= kMaxElements;
  return ok ? n : checked_numel(shape, what());
}

}  // namespace kqlora
