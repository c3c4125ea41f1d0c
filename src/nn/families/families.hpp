#pragma once
// The family files: each builds a DecoderSpec from a config.json of its model_type(s),
// reading its fields and refusing what kqlora does not implement. Adding a family: one
// file here and one row in the table of family_registry.cpp (docs/ARCHITECTURE.md).

#include "hf_config_reader.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::impl {

DecoderSpec llama_family(HfConfigReader& r, const std::string& model_type);  // llama, mistral
DecoderSpec qwen2_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec qwen3_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec gemma2_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec gemma3_family(HfConfigReader& r, const std::string& model_type);  // gemma3_text
DecoderSpec phi3_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec qwen3_moe_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec mixtral_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec olmoe_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec gpt_oss_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec qwen2_moe_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec smollm3_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec olmo2_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec olmo3_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec granite_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec qwen3_5_family(HfConfigReader& r, const std::string& model_type);      // qwen3_5_text
DecoderSpec qwen3_5_moe_family(HfConfigReader& r, const std::string& model_type);  // _text
DecoderSpec qwen3_5_multimodal_family(HfConfigReader& r,
                                      const std::string& model_type);  // qwen3_5, qwen3_5_moe
DecoderSpec qwen3_next_family(HfConfigReader& r, const std::string& model_type);
DecoderSpec gemma4_family(HfConfigReader& r, const std::string& model_type);  // gemma4_text
DecoderSpec gemma4_multimodal_family(HfConfigReader& r, const std::string& model_type);

}  // namespace kqlora::impl
