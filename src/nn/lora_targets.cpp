#include "kqlora/nn/lora_targets.hpp"

#include <algorithm>
#include <sstream>

#include "kqlora/core/error.hpp"

namespace kqlora {

std::vector<bool> parse_lora_targets(const std::string& text, const DecoderSpec& s,
                                     const std::string& where) {
  std::vector<bool> on(s.projections.size(), false);
  if (text == "all-linear") {
    on.assign(on.size(), true);
    return on;
  }
  const bool sparse = s.any_sparse_mlp();
  std::string valid;
  for (const auto& p : s.projections) valid += (valid.empty() ? "" : ",") + p.name;
  if (sparse) valid += std::string(",") + kExpertGateUp + "," + kExpertDown;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    if (sparse && (item == kExpertGateUp || item == kExpertDown)) continue;  // (the experts')
    const auto it = std::find_if(s.projections.begin(), s.projections.end(),
                                 [&](const ProjectionSpec& p) { return p.name == item; });
    KQLORA_INPUT_CHECK(it != s.projections.end(),
                       where << ": '" << item << "' is not a projection of " << s.model_type
                             << "; expected all-linear or a comma list of " << valid);
    const size_t p = static_cast<size_t>(it - s.projections.begin());
    KQLORA_INPUT_CHECK(!on[p], where << ": '" << item << "' is listed twice");
    bool some = false;
    for (int64_t l = 0; l < s.layers; ++l) some = some || s.has_projection(l, *it);
    KQLORA_INPUT_CHECK(some, where << ": '" << item << "': no layer of this " << s.model_type
                                   << " has it (its MLPs are experts: docs/MODELS.md, "
                                      "\"Experts\")");
    on[p] = true;
  }
  return on;
}

std::array<bool, 2> expert_lora_targets(const std::string& text, const DecoderSpec& s) {
  std::array<bool, 2> on{false, false};
  if (!s.any_sparse_mlp()) return on;
  if (text == "all-linear") return {true, true};
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    on[0] = on[0] || item == kExpertGateUp;
    on[1] = on[1] || item == kExpertDown;
  }
  return on;
}

}  // namespace kqlora
