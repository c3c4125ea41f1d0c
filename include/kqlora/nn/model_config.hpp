#pragma once
// The configuration of a model: which model (`kind`) and the settings every model reads.
// It has its own text form (`key = value` lines with the deck's key names), which a
// checkpoint stores so that its parameter table can be rebuilt from the file alone; the
// reader ignores other keys, so a whole deck's text parses as well.

#include <cstdint>
#include <string>

#include "kqlora/core/dtype.hpp"
#include "kqlora/nn/elementwise.hpp"
#include "kqlora/nn/loss.hpp"

namespace kqlora {

/// How a causal_lm keeps the activations its backward reads (deck key activation_dtype):
/// automatic is bfloat16 for a bfloat16 run on a GPU, float32 otherwise
/// (nn/decoder_buffers.hpp, keeps_bf16_activations).
enum class ActivationDtype { automatic, float32, bfloat16 };

struct ModelConfig {
  std::string kind = "lora_stack";
  int64_t dim = 128, num_layers = 1, rank = 64;
  double alpha = 16, dropout = 0;
  bool bias = false;
  Activation activation = Activation::none;
  DType dtype = DType::float32;
  int64_t block_size = 64, scaler_block_size = 256;
  uint64_t seed = 42;
  bool lora_b_zeros = false;
  LossKind loss = LossKind::sum;
  // Hugging Face models (causal_lm): the projections with adapters, the model directory, and
  // config.json's text (checkpoints store it, so readers need no directory).
  std::string lora_targets = "all-linear";
  // causal_lm with experts: the load-balancing loss added (auto: as config.json's
  // output_router_logits says; on; off)
  std::string router_aux_loss = "auto";
  std::string hf_model_dir;
  std::string arch_text;
  std::string arch_source = "config.json";  // where arch_text came from (for messages)
  // causal_lm: recompute each block's forward in its backward (the same numbers, less memory;
  // not part of the text form: a restart may change it).
  bool activation_checkpointing = false;
  // causal_lm: the kept activations' type (not part of the text form either).
  ActivationDtype activation_dtype = ActivationDtype::automatic;

  /// The LoRA scale alpha / rank, in float as the forward applies it.
  float scale() const { return static_cast<float>(alpha) / static_cast<float>(rank); }
  bool bf16() const { return dtype == DType::bfloat16; }

  /// `key = value` lines (model, dim, num_linears, lora_rank, lora_alpha, lora_dropout,
  /// bias, activation, dtype, block_size, scaler_block_size, seed, lora_b_init, loss,
  /// lora_targets, router_aux_loss, hf_model_dir); arch_text is not part of it.
  std::string to_text() const;
  /// The keys above from `text` (other keys and `#` comments ignored; a missing key keeps
  /// its default: `model` absent is lora_stack, as in checkpoints that predate it).
  /// InputError naming `source` for a value that does not parse.
  static ModelConfig from_text(const std::string& text, const std::string& source);
};

const char* activation_name(Activation a);
const char* loss_name(LossKind k);

}  // namespace kqlora
