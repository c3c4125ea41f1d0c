#include "kqlora/io/fletcher32.hpp"

namespace kqlora::h5 {

namespace {
uint32_t fold(uint32_t s) {
  return (s & 0xffff) + (s >> 16);
}
}  // namespace

uint32_t fletcher32(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t words = bytes / 2;
  uint32_t s1 = 0, s2 = 0;
  while (words > 0) {
    // Word by word, s1 += w_i and then s2 += s1. Over a block of n words that is
    // s2 += n * s1 + sum (n - i) w_i and s1 += sum w_i: the same values modulo 2^32 in a
    // form the compiler vectorizes (HDF5's loop is one chain of dependent adds).
    const uint32_t n = words < 360 ? static_cast<uint32_t>(words) : 360;
    uint32_t a = 0, b = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t w = (uint32_t(p[2 * i]) << 8) | p[2 * i + 1];
      a += w;
      b += (n - i) * w;
    }
    s2 += n * s1 + b;
    s1 += a;
    s1 = fold(s1);
    s2 = fold(s2);
    p += 2 * n;
    words -= n;
  }
  if (bytes % 2) {  // a last odd byte counts as the high byte of a word
    s1 += uint32_t(*p) << 8;
    s2 += s1;
    s1 = fold(s1);
    s2 = fold(s2);
  }
  s1 = fold(s1);
  s2 = fold(s2);
  return (s2 << 16) | s1;
}

}  // namespace kqlora::h5
