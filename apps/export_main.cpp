// kqlora-export: a checkpoint's weights for other tools: the merged weights (dequantized
// base + scale * B A), the dequantized base alone, or the adapters in PEFT's layout
// (docs/CHECKPOINTS.md, "Exports").

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include "app_main.hpp"
#include "export_writers.hpp"
#include "kqlora/core/atomic_output.hpp"
#include "kqlora/core/output_guard.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/nn/model_config.hpp"
#include "kqlora/train/base_from_model_dir.hpp"

namespace {

namespace fs = std::filesystem;

/// A checkpoint's files as a writer's inputs: each file, its step directory and the
/// save_dir's `latest` beside it.
std::vector<kqlora::WriterInput> checkpoint_inputs(const std::vector<std::string>& files) {
  std::vector<kqlora::WriterInput> in;
  for (const auto& f : files) {
    in.push_back({f, "the checkpoint file"});
    const fs::path step = fs::path(kqlora::written_path(f)).parent_path();
    // (a step directory of a save_dir: step-XXXXXXXX, with `latest` beside it)
    if (step.filename().string().rfind("step-", 0) != 0) continue;
    in.push_back({step.string(), "the checkpoint's step directory"});
    in.push_back({(step.parent_path() / "latest").string(), "the checkpoint's latest"});
  }
  return in;
}

/// What a checkpoint file's attributes say of its run, without reading its tensors.
struct RunOfCheckpoint {
  std::string hf_model_dir;
  bool hf = false;  // a model imported from a Hugging Face directory (hf_config)
};

RunOfCheckpoint run_of(const std::string& file) {
  kqlora::h5::InputFileScope scope(file);
  const auto f = kqlora::h5::open_file(file);
  const char* key = kqlora::h5::has_attribute(f, "model_config") ? "model_config" : "config";
  RunOfCheckpoint r;
  r.hf_model_dir = kqlora::ModelConfig::from_text(kqlora::h5::read_string_attribute(f, key, file),
                                                  file + " (" + key + ")")
                       .hf_model_dir;
  r.hf = kqlora::h5::has_attribute(f, "hf_config");
  return r;
}

/// A directory output replaces an existing, non-empty directory only when it is an earlier
/// kqlora-export of the same kind: its `key` file's safetensors metadata says producer
/// kqlora-export (names alone could be another model's save_pretrained directory).
void refuse_foreign_export(const std::string& option, const std::string& dir,
                           const std::string& key) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::is_empty(dir, ec)) return;
  const std::string path = dir + "/" + key;
  std::string producer;
  if (fs::is_regular_file(path, ec)) {
    try {
      const auto h = kqlora::safetensors::read_header(path);
      const auto it = h.metadata.find("producer");
      if (it != h.metadata.end()) producer = it->second;
    } catch (const kqlora::InputError&) {  // (damaged: not ours to replace either)
    }
  }
  KQLORA_INPUT_CHECK(producer == "kqlora-export",
                     option << " " << dir << " is not an earlier kqlora-export output (" << key
                            << (producer.empty() ? std::string(" is missing or names no producer")
                                                 : " was written by " + producer)
                            << "): choose a new or empty directory");
}

const char* usage =
    "usage: kqlora-export CHECKPOINT --merged OUT [--dtype float32|bfloat16]\n"
    "       kqlora-export CHECKPOINT --base OUT [--dtype float32|bfloat16]\n"
    "       kqlora-export CHECKPOINT --peft DIR\n"
    "       kqlora-export CHECKPOINT --gguf OUT.gguf [--gguf-of merged|base]\n"
    "                     [--gguf-type f32|f16|bf16|q8_0]\n"
    "\n"
    "CHECKPOINT is a checkpoint file, a step directory or a save_dir (its latest).\n"
    "OUT (DIR) may not be, lie inside or contain an input: a checkpoint file, its step\n"
    "directory, the save_dir's latest, the run's hf_model_dir (exit 2). Files are written\n"
    "under a temporary name beside OUT and renamed; directories (--peft, and --merged/--base\n"
    "of a Hugging Face model) written whole beside DIR and swapped in; an existing DIR must\n"
    "be empty or an earlier export of the same kind (its safetensors' metadata says producer\n"
    "kqlora-export; docs/RELIABILITY.md, \"Writers\").\n"
    "  --merged OUT    every NF4 weight dequantized, plus (alpha/rank) * B A where a LoRA\n"
    "                  adapter targets it, and the other tensors (biases, frozen dense) as\n"
    "                  they are. A model imported from a Hugging Face directory (causal_lm):\n"
    "                  OUT is a Hugging Face model directory (model.safetensors with HF\n"
    "                  names, lm_head.weight only when untied; config.json from the\n"
    "                  checkpoint; tokenizer and generation files copied from hf_model_dir\n"
    "                  when it is there). Other models: OUT is one safetensors file (names\n"
    "                  as in the checkpoint).\n"
    "  --base OUT      the same without the adapters: the dequantized NF4 base the adapters\n"
    "                  were trained on (PeftModel.from_pretrained on it and --peft's\n"
    "                  adapters gives the trained model)\n"
    "  --dtype T       float32 (default) or bfloat16 (rounded to nearest even)\n"
    "  --peft DIR      DIR/adapter_model.safetensors (base_model.model.<module>.lora_A.weight,\n"
    "                  lora_B.weight, e.g. base_model.model.model.layers.0.self_attn.q_proj.\n"
    "                  lora_A.weight) and DIR/adapter_config.json (peft_type LORA; causal_lm:\n"
    "                  task_type CAUSAL_LM, base_model_name_or_path the run's hf_model_dir)\n"
    "  --gguf OUT      a GGUF file for llama.cpp (docs/GGUF.md): the merged weights\n"
    "                  (--gguf-of base: the dequantized NF4 base alone), matrices as\n"
    "                  --gguf-type (default bf16; q8_0 as the gguf package's Q8_0), vectors\n"
    "                  f32, llama.cpp's architecture, names and metadata for the family\n"
    "                  (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3; settings llama.cpp\n"
    "                  cannot run are refused, naming the config.json field), and the\n"
    "                  tokenizer and chat template of hf_model_dir\n"
    "  --version       version and build configuration\n"
    "Exit codes: 0 done, 2 bad input, 1 other failure.\n";

int export_main(std::vector<std::string>& args) {
  std::string merged, base, peft, dtype = "float32", gguf_out, gguf_of = "merged",
                                  gguf_type = "bf16";
  const bool has_merged = kqlora::app::take_option(args, "--merged", &merged);
  const bool has_base = kqlora::app::take_option(args, "--base", &base);
  const bool has_peft = kqlora::app::take_option(args, "--peft", &peft);
  const bool has_dtype = kqlora::app::take_option(args, "--dtype", &dtype);
  const bool has_gguf = kqlora::app::take_option(args, "--gguf", &gguf_out);
  const bool has_gguf_of = kqlora::app::take_option(args, "--gguf-of", &gguf_of);
  const bool has_gguf_type = kqlora::app::take_option(args, "--gguf-type", &gguf_type);
  for (const auto& a : args)
    KQLORA_INPUT_CHECK(a.empty() || a[0] != '-', "unknown option '" << a << "' (see --help)");
  KQLORA_INPUT_CHECK(args.size() == 1, "expected one CHECKPOINT (see --help)");
  KQLORA_INPUT_CHECK(int(has_merged) + int(has_base) + int(has_peft) + int(has_gguf) == 1,
                     "give exactly one of --merged OUT, --base OUT, --peft DIR and --gguf OUT");
  KQLORA_INPUT_CHECK(has_gguf || (!has_gguf_of && !has_gguf_type),
                     "--gguf-of and --gguf-type go with --gguf OUT");
  KQLORA_INPUT_CHECK(gguf_of == "merged" || gguf_of == "base",
                     "--gguf-of: expected merged or base, got '" << gguf_of << "'");
  const auto gguf_tensor_type = kqlora::gguf::tensor_type_from_name(gguf_type, "--gguf-type");
  KQLORA_INPUT_CHECK(!has_dtype || !has_gguf, "--dtype: use --gguf-type with --gguf");
  KQLORA_INPUT_CHECK(dtype == "float32" || dtype == "bfloat16",
                     "--dtype: expected float32 or bfloat16, got '" << dtype << "'");
  KQLORA_INPUT_CHECK(!has_dtype || !has_peft, "--dtype: the adapters are always float32");
  const auto files = kqlora::checkpoint_files(args[0]);
  const std::string option = has_merged ? "--merged"
                             : has_base ? "--base"
                             : has_peft ? "--peft"
                                        : "--gguf";
  const std::string& out = has_merged ? merged : has_base ? base : has_peft ? peft : gguf_out;
  // No export destroys one of its inputs (docs/RELIABILITY.md, "Writers"): checked from
  // the checkpoint's attributes, before its tensors are read.
  const RunOfCheckpoint run = run_of(files.front());
  std::vector<kqlora::WriterInput> inputs = checkpoint_inputs(files);
  inputs.push_back({run.hf_model_dir, "the run's hf_model_dir"});
  kqlora::refuse_output_over_inputs(option, out, inputs);
  // A Hugging Face model's --merged/--base and every --peft are directories, written whole
  // beside OUT and swapped in; the others are files, renamed into place.
  const bool directory = has_peft || (!has_gguf && run.hf);
  const std::string key = has_peft ? "adapter_model.safetensors" : "model.safetensors";
  const auto own =
      has_peft ? kqlora::exporter::peft_directory_entry : kqlora::exporter::hf_directory_entry;
  if (directory) {
    kqlora::DirectoryOutput::check(option, out, own);
    refuse_foreign_export(option, out, key);
  } else {
    kqlora::check_file_output(option, out);
  }
  // DDP ranks hold the same parameters (rank 0's file speaks for the run); FSDP shards are
  // reassembled.
  std::vector<kqlora::CheckpointContents> parts;
  for (const auto& f : files) parts.push_back(kqlora::read_checkpoint_file(f));
  auto c = kqlora::assemble_checkpoint(parts, args[0]);
  const std::string& file = files.front();
  std::optional<kqlora::DirectoryOutput> dir;
  if (directory) dir.emplace(option, out, own);
  // checkpoint_base = auto: the base quantized again from the run's hf_model_dir.
  if (!has_peft) kqlora::load_base_from_model_dir(c, args[0]);
  const bool bf16 = dtype == "bfloat16";
  if (has_peft) {
    kqlora::exporter::write_peft(c, file, dir->temp(), out);
  } else if (has_gguf) {
    kqlora::exporter::write_gguf(c, file, gguf_out, gguf_tensor_type, gguf_of == "merged");
  } else {
    if (!dir)
      kqlora::exporter::write_weights(c, file, out, bf16, has_merged);
    else
      kqlora::exporter::write_hf_directory(c, file, dir->temp(), out, bf16, has_merged);
  }
  if (dir) dir->commit();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-export", usage, export_main);
}
