#pragma once
// Which weights of a decoder get LoRA adapters (deck key lora_targets; docs/MODELS.md):
// "all-linear", or a comma list of the family's projection names and, in a model with
// experts, experts.gate_up_proj and experts.down_proj -- spelled apart from a dense MLP's
// gate_proj and down_proj, as PEFT's target_parameters names the fused expert parameters.

#include <array>
#include <string>
#include <vector>

#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora {

/// The experts' targets: one adapter on each expert's gate and up (sharing its A, as PEFT
/// puts one on the fused gate_up_proj), one on its down.
constexpr const char* kExpertGateUp = "experts.gate_up_proj";
constexpr const char* kExpertDown = "experts.down_proj";

/// Which projections of `s` get adapters: "all-linear" or a comma list of the family's
/// projection names (and the experts' two). InputError naming `where` and listing the
/// valid names otherwise, or for a projection no layer has.
std::vector<bool> parse_lora_targets(const std::string& text, const DecoderSpec& s,
                                     const std::string& where);

/// Whether the experts' gate_up and down get adapters (all-linear: both, in a model with
/// sparse layers).
std::array<bool, 2> expert_lora_targets(const std::string& text, const DecoderSpec& s);

}  // namespace kqlora
