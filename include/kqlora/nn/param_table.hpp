#pragma once
// The parameter table a model publishes: every tensor it holds, with its shape, kind,
// group and initial-value rule. Initialisation, checkpoints (write, read, validation),
// restarts, DDP buckets, FSDP shards, kqlora-diff and kqlora-export iterate it; none of
// them spells a parameter name or shape (docs/ARCHITECTURE.md, "The model interface").

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kqlora/core/dtype.hpp"
#include "kqlora/quant/nf4_layout.hpp"

namespace kqlora {

enum class ParamKind {
  trainable,  // float32 master weights, in the model's flat parameter buffer
  nf4,        // frozen, NF4 (quantized from its dtype)
  dense,      // frozen, dense in its dtype (held as float32 values of that dtype; a
              // `compact` bfloat16 one as bfloat16)
};

/// How a tensor is initialised from the seed (core/random.hpp), when no file provides it.
struct InitRule {
  enum class Dist {
    zeros,
    uniform,  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): kaiming-uniform with a = sqrt(5)
    normal,   // N(0, 1), generated in float32
    file,     // from the model's own files only (e.g. a Hugging Face model directory);
              // absent there and in the init_file: an error
  };
  Dist dist = Dist::zeros;
  int64_t fan_in = 1;
  uint64_t stream = 0;  // a RandomStream, offset by the layer
};

/// An entry's values inside another tensor of a model file: element (r, c) of the entry
/// (as [rows, cols]: a vector is one row) is element first + r * row_stride + c * col_stride
/// of `tensor` [shape], row-major -- an expert of transformers 5's fused layout (one [E, 2I,
/// hidden] gate_up_proj, one [E, hidden, I] down_proj), or of gpt-oss's (gate and up
/// interleaved in a transposed [E, hidden, 2I]). `mxfp4`: the tensor is stored as MXFP4
/// (<tensor>_blocks [..., cols / 32, 16] and <tensor>_scales [..., cols / 32] bytes), `shape`
/// what they decode to (quant/mxfp4.hpp).
struct TensorSlice {
  std::string tensor;
  std::vector<int64_t> shape;
  int64_t first = 0, row_stride = 0, col_stride = 1;  // row_stride 0: the entry's width
  bool mxfp4 = false;
};

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;  // [out, in] for a weight, [n] for a vector
  ParamKind kind = ParamKind::trainable;
  DType dtype = DType::float32;  // nf4 and dense: the dtype of their values
  int group = 0;                 // index into ParamTable::groups
  InitRule init;
  std::string tied_to;  // the entry whose storage this one reads (empty: its own)
  /// trainable: first element in the flat buffers; nf4 / dense: index among the model's
  /// tensors of that kind (Model::nf4, Model::dense).
  int64_t offset = 0;
  int64_t block_size = 64, scaler_block_size = 256;  // nf4
  /// dense, dtype bfloat16: held in 16 bits (Model::dense_bf16), not as float32 values --
  /// a large table read only by lookups (Gemma 4's per-layer embeddings).
  bool compact = false;
  /// Where a model file may hold it instead (TensorSlice; none: nowhere else), in order of
  /// preference for writing (kqlora-export writes the first).
  std::vector<TensorSlice> alts;

  int64_t numel() const;
  /// The NF4 layout of an nf4 entry.
  Nf4Layout nf4_layout() const;
};

/// A LoRA adapter over a frozen weight: y = W x + scale * B (A x). Exports merge it and
/// write it in PEFT's layout under `module`.
struct LoraAdapter {
  std::string module;  // e.g. "layers.0"
  std::string base;    // the frozen weight's entry
  std::string a, b;    // entries of A [rank, in] and B [out, rank]
  double alpha = 0;    // scale = alpha / rank
  int64_t rank = 0;
  double dropout = 0;
};

/// LoRA on one fused parameter of a sparse layer's experts, as PEFT's target_parameters puts
/// it on transformers 5's (docs/MODELS.md, "Experts"): per expert e a rank-r adapter, its
/// A rows e*r .. e*r+r-1 of `a` [E * r, in], its B rows e*out .. e*out+out-1 of `b`
/// [E * out, r] (PEFT's lora_B is [out, r * E], expert e in columns k * E + e).
struct ExpertAdapter {
  std::string module;        // transformers 5's module path: "model.layers.0.mlp.experts"
  std::string parameter;     // the fused parameter: "gate_up_proj" or "down_proj"
  std::string target;        // PEFT's target_parameters entry: "mlp.experts.gate_up_proj"
  bool inner = false;        // two wrappers on one module: this one is PEFT's "base_layer"
  bool interleaved = false;  // PEFT's B rows in gpt-oss's gate_up order (gate i at 2i, up 2i+1)
  std::string a, b;          // the entries
  /// The NF4 entries the adapter adds to, expert by expert: each expert's `parts` tensors
  /// (gate then up, or down) split its out rows evenly.
  std::vector<std::string> bases;
  int64_t experts = 0, rank = 0, out = 0, in = 0;
  double alpha = 0;
  int64_t parts() const { return static_cast<int64_t>(bases.size()) / experts; }
};

struct ParamTable {
  std::string model_kind;
  std::vector<ParamEntry> entries;
  std::vector<std::string> groups;
  std::vector<LoraAdapter> adapters;
  std::vector<ExpertAdapter> expert_adapters;
  /// Name prefixes every base-file tensor under which must be one of the table's (a sparse
  /// layer's experts: an expert the config does not have is a damaged or mismatched model,
  /// not a tensor to skip with a note).
  std::vector<std::string> owned_prefixes;
  /// Where the model's files keep the tensors the table names "model.*" (empty: there):
  /// a multimodal directory's language model, "model.language_model." (Qwen3.5).
  std::string file_prefix;
  /// Name prefixes of a model file's tensors that are not read, each with why (a vision
  /// tower, a multi-token prediction head): reported together at set-up.
  std::vector<std::pair<std::string, std::string>> skipped_prefixes;
  int64_t num_trainable = 0;  // floats in the flat buffers

  /// Appends an entry (a new group when `group` names none yet); trainable entries are
  /// laid out end to end in the order added, so a group's adapters are contiguous when
  /// added together. Returns the entry.
  ParamEntry& add(ParamEntry e, const std::string& group);

  const ParamEntry* find(const std::string& name) const;
  const ParamEntry& at(const std::string& name) const;  // Error when absent
  /// The expert adapter adding to NF4 entry `name` (its index in `bases` in *base), or whose
  /// A or B `name` is; null: none.
  const ExpertAdapter* expert_adapter_of(const std::string& name, int64_t* base = nullptr) const;
  int num_groups() const { return static_cast<int>(groups.size()); }
  /// The entries of one kind, in table order.
  std::vector<const ParamEntry*> of_kind(ParamKind k) const;
  int64_t count(ParamKind k) const;
  /// The flat range [lo, hi) of a group's trainable entries (lo == hi: none). Error when
  /// they are not contiguous.
  std::pair<int64_t, int64_t> trainable_range(int group) const;
  /// Indices (ParamEntry::offset) of a group's nf4 entries.
  std::vector<int> nf4_of_group(int group) const;

 private:
  // Name lookups (a 30B model's table has tens of thousands of entries): built on first use
  // and again whenever entries were appended since.
  mutable std::unordered_map<std::string, size_t> index_;
  mutable std::unordered_map<std::string, std::pair<size_t, int64_t>> expert_index_;
  mutable size_t expert_indexed_ = 0;
};

}  // namespace kqlora
