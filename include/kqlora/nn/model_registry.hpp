#pragma once
// Models by kind (ModelConfig::kind): a model registers how to build its parameter table
// and an instance; the trainer, checkpoints, kqlora-diff and kqlora-export ask here and
// know no model by name. Built in: lora_stack, causal_lm (alias llama).

#include <Kokkos_Core.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kqlora/nn/model.hpp"

namespace kqlora {

using DefaultModel = Model<Kokkos::DefaultExecutionSpace>;

/// A model's size without building its table (a deck asking for billions of tensors is
/// refused before any is made): element counts by kind of tensor.
struct ModelFootprint {
  int64_t tensors = 0, nf4_elements = 0, dense_elements = 0, trainable_elements = 0;
  int64_t compact_dense_elements = 0;      // (of dense_elements: held in bfloat16)
  int64_t largest_nf4_elements = 0;        // (set-up holds its float32 values while quantizing it)
  int64_t largest_group_nf4_elements = 0;  // (FSDP gathers a group's NF4 whole: a layer's)
};

struct ModelKind {
  /// The table of a configuration (no tensors allocated).
  std::function<ParamTable(const ModelConfig&)> table;
  /// An instance with its tensors allocated; `zeroed` false leaves the master weights and
  /// gradients unwritten (the caller writes every parameter; a step's first backward
  /// writes the gradients).
  std::function<std::unique_ptr<DefaultModel>(const Kokkos::DefaultExecutionSpace&,
                                              const ModelConfig&, bool zeroed)>
      make;
  /// The deck's model keys this kind reads (empty: all of them); the echo of the effective
  /// configuration comments out the others.
  std::vector<std::string> deck_keys;
  /// Its size, computed without the table (sizes overflow-checked: InputError); empty:
  /// counted from the table (model_footprint).
  std::function<ModelFootprint(const ModelConfig&)> footprint;
  /// An estimate of the bytes one forward and backward of `rows` rows of `seq_len`
  /// positions (0: a model without tokens) keeps alive: saved activations, gradients of
  /// activations, workspaces (the memory check, train/memory_check.hpp); empty: unknown.
  std::function<int64_t(const ModelConfig&, int64_t rows, int64_t seq_len)> activation_bytes;
  /// A token model: its data_file holds token ids and labels, its loss is cross_entropy,
  /// its lora_rank defaults to 8 and its LoRA B to zeros (PEFT's defaults).
  bool tokens = false;
  /// The deck keys and inputs that size it (the memory check's message).
  std::string size_keys;
};

/// Adds (or replaces) a kind.
void register_model(const std::string& kind, ModelKind k);
/// The kind an alias stands for (llama: causal_lm), or `kind` itself.
std::string canonical_model_kind(const std::string& kind);
/// The registered kind; InputError listing the known ones otherwise.
const ModelKind& model_kind(const std::string& kind);
std::vector<std::string> model_kinds();

/// A table's element counts by kind.
ModelFootprint footprint_of(const ParamTable& t);
/// The kind's footprint, or its table's where it gives none.
inline ModelFootprint model_footprint(const ModelConfig& cfg) {
  const ModelKind& k = model_kind(cfg.kind);
  return k.footprint ? k.footprint(cfg) : footprint_of(k.table(cfg));
}

inline ParamTable model_table(const ModelConfig& cfg) {
  return model_kind(cfg.kind).table(cfg);
}
inline std::unique_ptr<DefaultModel> make_model(const Kokkos::DefaultExecutionSpace& exec,
                                                const ModelConfig& cfg, bool zeroed = true) {
  return model_kind(cfg.kind).make(exec, cfg, zeroed);
}

}  // namespace kqlora
