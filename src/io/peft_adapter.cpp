#include "kqlora/io/peft_adapter.hpp"

#include <utility>

#include "kqlora/core/error.hpp"

namespace kqlora::peft {

std::string adapter_key(const std::string& module, bool b) {
  return std::string(kPrefix) + module + (b ? ".lora_B.weight" : ".lora_A.weight");
}

std::string tensor_key(const std::string& name) {
  return std::string(kPrefix) + name;
}

std::string kqlora_name(const std::string& key, const std::string& where) {
  const std::string prefix = kPrefix;
  KQLORA_INPUT_CHECK(
      key.compare(0, prefix.size(), prefix) == 0,
      where << ": tensor '" << key << "' is not under " << prefix << " (not PEFT's layout)");
  std::string name = key.substr(prefix.size());
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{".lora_A.weight", ".lora_a.weight"},
        {".lora_B.weight", ".lora_b.weight"}}) {
    const size_t at = name.size() >= from.size() ? name.size() - from.size() : 0;
    if (name.size() > from.size() && name.compare(at, from.size(), from) == 0)
      return name.substr(0, at) + to;
  }
  return name;
}

}  // namespace kqlora::peft
