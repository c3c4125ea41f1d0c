#include "kqlora/core/content_hash.hpp"

#include <cstdio>
#include <cstring>

#include "kqlora/core/error.hpp"
#include "kqlora/core/random.hpp"

namespace kqlora {

void ContentHash::add(const void* data, size_t n) {
  add_last(data, n, n);
}

void ContentHash::add_words(const void* data, size_t n) {
  KQLORA_CHECK(n % 8 == 0, "ContentHash::add_words: " << n << " bytes, not whole words");
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h_ = random_mix(h_ ^ w) + 0x9e3779b97f4a7c15ull;
  }
}

void ContentHash::add_last(const void* data, size_t n, size_t total) {
  const size_t words = n / 8 * 8;
  add_words(data, words);
  uint64_t tail = 0;
  std::memcpy(&tail, static_cast<const unsigned char*>(data) + words, n - words);
  const uint64_t h = random_mix(h_ ^ tail ^ (static_cast<uint64_t>(n - words) << 56));
  h_ = random_mix(h ^ static_cast<uint64_t>(total));
}

std::string ContentHash::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

}  // namespace kqlora
