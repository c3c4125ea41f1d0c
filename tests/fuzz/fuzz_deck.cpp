// libFuzzer: the deck parser, and the stored configuration's round trip: a deck that parses
// echoes (to_deck_text, what checkpoints store) a text that parses to the same
// configuration. Anything but an InputError escaping is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/train/config.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("KQLORA_MEMORY_LIMIT", "268435456", 1);  // big decks are refused, not built
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kqlora::Config c;
  try {
    c = kqlora::parse_deck_text(text, "fuzz.in", {}, 1, false);
  } catch (const kqlora::InputError&) {
    return 0;
  }
  const std::string echo = c.to_deck_text();
  const kqlora::Config back = kqlora::parse_deck_text(echo, "echo", {}, 1, false);
  if (back.to_deck_text() != echo) std::abort();
  return 0;
}
