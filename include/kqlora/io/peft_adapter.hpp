#pragma once
// PEFT's adapter format, its tensor names: adapter_model.safetensors holds
// base_model.model.<module>.lora_A.weight and .lora_B.weight for kqlora's
// <module>.lora_a.weight and .lora_b.weight, and base_model.model.<name> for any other
// trainable tensor. kqlora-export writes these names, an init_file that is a PEFT
// adapter directory is read through them (docs/FINETUNING.md).

#include <string>

namespace kqlora::peft {

/// The prefix of every tensor name of an adapter file.
inline constexpr const char* kPrefix = "base_model.model.";

/// PEFT's name of the A (b false) or B (b true) matrix of `module`'s adapter.
std::string adapter_key(const std::string& module, bool b);
/// PEFT's name of another trainable tensor.
std::string tensor_key(const std::string& name);
/// kqlora's name of PEFT's `key`; InputError naming `where` for a name outside the layout.
std::string kqlora_name(const std::string& key, const std::string& where);

}  // namespace kqlora::peft
