#pragma once
// A 64-bit hash of byte streams, to tell two large tensors' contents apart (the identity
// of a frozen base, docs/CHECKPOINTS.md): word-wise splitmix mixing, fast enough for
// hundreds of megabytes at start-up. Not cryptographic.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kqlora {

class ContentHash {
 public:
  /// Adds n bytes (their length too, so ("ab", "c") and ("a", "bc") differ).
  void add(const void* data, size_t n);
  void add(const std::string& s) { add(s.data(), s.size()); }
  /// add(data, n) for bytes that come in pieces: add_words for each but the last (whole
  /// 8-byte words), then add_last with the last piece and n, the length of them all.
  void add_words(const void* data, size_t n);
  void add_last(const void* data, size_t n, size_t total);
  /// 16 lowercase hex digits.
  std::string hex() const;

 private:
  uint64_t h_ = 0x6b716c6f72610001ull;
};

}  // namespace kqlora
