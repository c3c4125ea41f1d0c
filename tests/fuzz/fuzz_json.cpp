// libFuzzer: the JSON reader (config.json, adapter_config.json, safetensors headers), and
// its writer's round trip: what parses writes a text that parses to the same text again.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kqlora::json::Value v;
  try {
    v = kqlora::json::parse(text, "fuzz.json");
  } catch (const kqlora::InputError&) {
    return 0;
  }
  const std::string once = kqlora::json::write(v);
  const std::string twice = kqlora::json::write(kqlora::json::parse(once, "written"));
  if (once != twice) std::abort();
  return 0;
}
