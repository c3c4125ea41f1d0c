#pragma once
// The run configuration: input decks (docs/TRAINING.md; the keys: kqlora-train --help): `key =
// value` lines, `#` comments, blank lines; `key=value` overrides after the deck. Every error names
// the file and line (or the argument) and is an InputError.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/core/dtype.hpp"

namespace kqlora {

struct Config {
  // model
  std::string model = "lora_stack";  // a registered model kind (nn/model_registry.hpp)
  int64_t dim = 128, num_linears = 1, lora_rank = 64;
  double lora_alpha = 16, lora_dropout = 0;
  std::string lora_b_init = "kaiming";      // zeros | kaiming (causal_lm: zeros)
  std::string hf_model_dir;                 // causal_lm: config.json + model.safetensors
  std::string lora_targets = "all-linear";  // causal_lm: projections with adapters
  bool activation_checkpointing = false;    // causal_lm: recompute blocks in the backward
  std::string activation_dtype = "auto";    // causal_lm: auto | float32 | bfloat16 (kept)
  std::string checkpoint_base = "auto";     // causal_lm: auto (its hash) | true (its tensors)
  bool bias = false;
  std::string activation = "none";  // none | relu | gelu | silu
  int64_t block_size = 64, scaler_block_size = 256;
  DType dtype = DType::float32;
  std::string device = "auto";  // auto | host | cuda
  int64_t seed = 42;
  // batch and steps
  int64_t global_bs = 8, micro_bs = 8, num_steps = 3;
  std::string loss = "sum";  // sum | mse
  // what the run optimises on token files (docs/TRAINING.md, "Preference training"): sft,
  // or a preference objective over pair files, with TRL's names and defaults
  std::string objective = "sft";      // sft | dpo | simpo | orpo
  std::string loss_type = "sigmoid";  // dpo: sigmoid | hinge | ipo | robust
  double beta = 0.1, label_smoothing = 0, simpo_gamma = 0.5;
  // dpo: the reference's log-probabilities computed once, before the first step, and kept
  // in a side file of save_dir keyed by the data, the base and the starting adapters
  bool precompute_ref_log_probs = false;
  // optimizer
  std::string optimizer = "adam";  // sgd | adam | adamw
  double lr = 1e-2, momentum = 0, eps = 1e-8, weight_decay = 0;
  std::array<double, 2> betas = {0.9, 0.999};
  std::string lr_schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  double grad_clip = 0;
  std::string nonfinite = "stop";  // stop | skip
  // files
  std::string init_file, data_file, eval_file;
  int64_t eval_every = 0;
  bool shuffle = false;  // data_file's rows in a seeded permutation per epoch
  // causal_lm with experts: the load-balancing loss (auto: config.json's output_router_logits)
  std::string router_aux_loss = "auto";
  // token files' tokenizer_sha256 against hf_model_dir's tokenizer (docs/MODELS.md)
  std::string tokenizer_check = "on";
  // parallelism
  std::string parallel = "ddp", comm = "auto";
  std::string ddp_shared_memory = "auto", ddp_overlap = "auto";  // auto | on | off
  // auto: one rank takes the single-process strategy (no collective); off: DDP's buckets
  // (or FSDP) at one rank too, so that its collectives run (one GPU's NCCL)
  std::string single_process = "auto";
  double bucket_mb = 25, comm_timeout_s = 300;
  // checkpoints and logging
  std::string save_dir = "./checkpoints";
  int64_t checkpoint_every = 0;
  std::string checkpoint_layout = "per_rank";
  int64_t keep_last = 0;
  std::string restart = "none";
  int64_t log_every = 1;
  std::string metrics_file;  // empty: none
  // off: run even when the memory estimate exceeds the node's share (train/memory_check.hpp)
  std::string memory_check = "on";

  /// The effective configuration as deck text (every key, one per line), for the log and
  /// the checkpoints; parse_deck of this text gives back the same Config.
  std::string to_deck_text() const;
};

/// A deck file's text; InputError naming it when it is a directory or cannot be read.
std::string read_deck_file(const std::string& path);
/// Parses a deck file and `key=value` overrides. Checks types, ranges and consistency,
/// including world_size <= global_bs and (with check_files) that named input files can be
/// read.
Config parse_deck(const std::string& path, const std::vector<std::string>& overrides,
                  int world_size = 1, bool check_files = true);
/// The same from deck text (`source` names it in messages), e.g. a checkpoint's config.
Config parse_deck_text(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides, int world_size = 1,
                       bool check_files = true);

/// Every deck key, in the order to_deck_text prints them. The keys are declared once, in
/// one table (src/train/config.cpp), which the parser, the echo, deck_help and
/// restart_fixed_keys read.
const std::vector<std::string>& deck_keys();
/// A key's value as the echo prints it.
std::string deck_value(const Config& c, const std::string& key);
/// The keys a restart of `c` must not change (the checkpoint cannot carry the change
/// over), of those that apply to it.
std::vector<std::string> restart_fixed_keys(const Config& c);
/// The key list of kqlora-train --help: every key with its default (and choices), lines
/// of at most `width` characters.
std::string deck_help(int width = 88);

}  // namespace kqlora
