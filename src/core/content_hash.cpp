#include "kqlora/core/content_hash.hpp"

#include <cstdio>
#include <cstring>

#include "kqlora/core/random.hpp"

namespace kqlora {

void ContentHash::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = h_;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = random_mix(h ^ w) + 0x9e3779b97f4a7c15ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  h = random_mix(h ^ tail ^ (static_cast<uint64_t>(n - i) << 56));
  h_ = random_mix(h ^ static_cast<uint64_t>(n));
}

std::string ContentHash::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

}  // namespace kqlora
