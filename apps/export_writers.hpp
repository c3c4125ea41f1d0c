#pragma once
// What kqlora-export writes from a checkpoint (docs/CHECKPOINTS.md, "Exports"): the model's
// weights as safetensors (merged with the adapters, or the dequantized base alone), a
// Hugging Face model directory of them for models imported from one, and the adapters in
// PEFT's layout.

#include <string>
#include <vector>

#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/gguf_writer.hpp"

namespace kqlora::exporter {

/// NF4 weight e dequantized, plus (alpha / rank) * B A where an adapter targets it when
/// `merge` (*merged: whether one did), row-major [out, in].
std::vector<float> weight_values(const CheckpointContents& c, const ParamEntry& e,
                                 const std::string& file, bool merge, bool* merged = nullptr);
/// A dense (not NF4) tensor's values; InputError naming `file` when it is missing.
const std::vector<float>& dense_values(const CheckpointContents& c, const std::string& name,
                                       const std::string& file);
/// The run's hf_model_dir as the checkpoint's model configuration gives it.
std::string hf_model_dir(const CheckpointContents& c, const std::string& file);
/// Whether `name` is a LoRA adapter's A or B.
bool is_adapter_tensor(const CheckpointContents& c, const std::string& name);

/// Every tensor of the checkpoint's table as safetensors `out`: each NF4 weight dequantized
/// -- plus (alpha / rank) * B A where an adapter targets it when `merge` -- and the other
/// tensors (biases, frozen dense) as they are; the adapters' A and B are not written.
/// `file` names the checkpoint in messages, `shown` the output (default: `out`).
void write_weights(const CheckpointContents& c, const std::string& file, const std::string& out,
                   bool bf16, bool merge, const std::string& shown = "");

/// A Hugging Face model directory `dir` of a model imported from one (c.arch_text set):
/// model.safetensors as write_weights writes it (tied heads omitted: HF names), config.json
/// from the checkpoint with its dtype set to the exported one (and no quantization_config),
/// and the tokenizer and generation files of the run's hf_model_dir where it is there.
/// `dir` is where the files go (a DirectoryOutput's temporary), `shown` the name messages
/// give it (the output).
void write_hf_directory(const CheckpointContents& c, const std::string& file,
                        const std::string& dir, const std::string& shown, bool bf16, bool merge);
/// Whether `name` is one write_hf_directory may write (an earlier output holds only these).
bool hf_directory_entry(const std::string& name);

/// A GGUF file `out` for llama.cpp (docs/GGUF.md, "The export"): the weights as
/// write_weights makes them (merged when `merge`), matrices as `type` and vectors as F32,
/// under llama.cpp's names and metadata; the llama architecture only so far.
void write_gguf(const CheckpointContents& c, const std::string& file, const std::string& out,
                gguf::TensorType type, bool merge);

/// The adapters in PEFT's layout: dir/adapter_model.safetensors
/// (base_model.model.<module>.lora_A.weight, lora_B.weight; other trainable tensors under
/// base_model.model.<name>) and dir/adapter_config.json (peft_type LORA; for Hugging Face
/// models task_type CAUSAL_LM, target_modules the projection names and
/// base_model_name_or_path the run's hf_model_dir).
/// `dir` and `shown` as for write_hf_directory.
void write_peft(const CheckpointContents& c, const std::string& file, const std::string& dir,
                const std::string& shown);
/// Whether `name` is one write_peft writes.
bool peft_directory_entry(const std::string& name);

}  // namespace kqlora::exporter
