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

std::string expert_adapter_key(const ExpertAdapter& ad, bool b, const std::string& module) {
  return std::string(kPrefix) + (module.empty() ? ad.module : module) +
         (ad.inner ? ".base_layer" : "") + (b ? ".lora_B.weight" : ".lora_A.weight");
}

std::vector<int64_t> peft_expert_b_shape(const ExpertAdapter& ad) {
  return {ad.out, ad.rank * ad.experts};
}

std::vector<float> convert_expert_b(const ExpertAdapter& ad, const std::vector<float>& b,
                                    bool to_peft) {
  const int64_t E = ad.experts, out = ad.out, r = ad.rank;
  KQLORA_CHECK(static_cast<int64_t>(b.size()) == E * out * r, "convert_expert_b: size");
  std::vector<float> v(b.size());
  // (gpt-oss's gate_up: PEFT's row 2i is gate i, 2i + 1 up i; kqlora's gate rows, then up)
  const auto peft_row = [&](int64_t o) {
    return ad.interleaved ? (o < out / 2 ? 2 * o : 2 * (o - out / 2) + 1) : o;
  };
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        const int64_t mine = (e * out + o) * r + k, peft = peft_row(o) * r * E + k * E + e;
        v[static_cast<size_t>(to_peft ? peft : mine)] =
            b[static_cast<size_t>(to_peft ? mine : peft)];
      }
  return v;
}

}  // namespace kqlora::peft
