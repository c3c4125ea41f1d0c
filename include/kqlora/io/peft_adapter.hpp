#pragma once
// PEFT's adapter format, its tensor names: adapter_model.safetensors holds
// base_model.model.<module>.lora_A.weight and .lora_B.weight for kqlora's
// <module>.lora_a.weight and .lora_b.weight, and base_model.model.<name> for any other
// trainable tensor; an expert adapter (target_parameters) is <module>.lora_A.weight of its
// experts module, or <module>.base_layer.lora_A.weight for the inner of two wrappers, with
// B in PEFT's [out, r * E] layout. kqlora-export writes these names, an init_file that is
// a PEFT adapter directory is read through them (docs/FINETUNING.md).

#include <string>
#include <vector>

#include "kqlora/nn/param_table.hpp"

namespace kqlora::peft {

/// The prefix of every tensor name of an adapter file.
inline constexpr const char* kPrefix = "base_model.model.";

/// PEFT's name of the A (b false) or B (b true) matrix of `module`'s adapter.
std::string adapter_key(const std::string& module, bool b);
/// PEFT's name of another trainable tensor.
std::string tensor_key(const std::string& name);
/// kqlora's name of PEFT's `key`; InputError naming `where` for a name outside the layout.
std::string kqlora_name(const std::string& key, const std::string& where);

/// PEFT's name of an expert adapter's A (b false) or B (b true).
/// (`module`: the experts' module path on the model PEFT loads, when not ad.module: a
/// multimodal model's, under its prefix)
std::string expert_adapter_key(const ExpertAdapter& ad, bool b, const std::string& module = "");
/// PEFT's shape of an expert adapter's B: [out, r * E].
std::vector<int64_t> peft_expert_b_shape(const ExpertAdapter& ad);
/// An expert adapter's B from kqlora's expert-major [E * out, r] to PEFT's [out, r * E]
/// (column k * E + e is expert e's k-th; an interleaved adapter's rows in gpt-oss's gate_up
/// order), or back (`to_peft` false).
std::vector<float> convert_expert_b(const ExpertAdapter& ad, const std::vector<float>& b,
                                    bool to_peft);

}  // namespace kqlora::peft
