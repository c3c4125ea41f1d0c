#include "kqlora/core/dtype.hpp"

#include "kqlora/core/error.hpp"

namespace kqlora {

const char* dtype_name(DType t) {
  return t == DType::float32 ? "float32" : "bfloat16";
}

DType parse_dtype(const std::string& s, const std::string& what) {
  if (s == "float32") return DType::float32;
  if (s == "bfloat16") return DType::bfloat16;
  KQLORA_INPUT_CHECK(false, what << ": expected float32 or bfloat16, got '" << s << "'");
}

}  // namespace kqlora

#include <cstring>

#include "kqlora/core/float16.hpp"

namespace kqlora {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up: Inf
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent, round the mantissa to 10 bits
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  // A subnormal half: units of 2^-24, rounded to nearest even (may carry into the
  // smallest normal, whose bits follow on).
  const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

}  // namespace kqlora
