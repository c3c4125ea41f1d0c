#pragma once
// Training and evaluation batches, in the form the model's InputSpec asks for: float rows
// from an HDF5 file (`inputs` [rows, features], `targets` [rows, target_features] when the
// loss needs them) or token ids (`input_ids` and `labels`, int32 [rows, seq_len], label
// -100 ignored; docs/TRAINING.md, "Data files"), or synthetic from the counter-based
// generator. Step s uses the global rows s*global_bs .. (s+1)*global_bs - 1 (modulo the
// file's rows), so a step's global batch is the same whatever the world size.

#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/nn/batch.hpp"
#include "kqlora/train/tokenizer_identity.hpp"

namespace kqlora {

/// A token file's sequence length (input_ids' second dimension), 0 for a path that is empty
/// or not a token file: the memory check needs it before the data is read.
int64_t token_file_seq_len(const std::string& path);

/// What a token file is checked against beyond the model's vocabulary (docs/MODELS.md,
/// "Data files").
struct TokenFileChecks {
  TokenizerIdentity tokenizer;   // hf_model_dir's (empty sha256: nothing to compare with)
  bool tokenizer_check = false;  // the deck's tokenizer_check = on
};

class DataSource {
 public:
  /// `path` empty: synthetic data from `seed` (token labels equal the ids, as for a
  /// language model whose labels are its inputs). Token files: a spec with seq_len 0 takes
  /// the file's; a vocab_size attribute must equal the model's vocabulary.
  /// `shuffle`: the file's rows in a permutation per epoch, seeded by (seed, epoch) --
  /// global sample g of the run is row perm_e(g mod rows) of epoch e = g / rows, whatever
  /// the world size.
  /// Token files are refused (InputError naming the file) when no label is scored (every
  /// one -100 or at a document's first position), when ids, labels or positions are not
  /// integers or out of range, and when made with another tokenizer than `checks` names.
  DataSource(const std::string& path, const InputSpec& spec, int64_t global_bs, uint64_t seed,
             const std::string& what, bool shuffle = false, const TokenFileChecks& checks = {});

  /// What the log should say once about the file (rows scoring nothing, a tokenizer not
  /// compared), each a line.
  const std::vector<std::string>& notes() const { return notes_; }

  /// Row-major float rows (and targets) of samples first .. first+n-1 of `step`, from the
  /// file (synthetic rows come from fill_normal_rows, keyed by global_sample).
  void inputs(int64_t step, int64_t first, int64_t n, float* out) const;
  void targets(int64_t step, int64_t first, int64_t n, float* out) const;
  /// Token ids and labels [n, seq_len] of those samples (file or synthetic), and their
  /// position_ids where the file has them (packed(); `positions` may be null).
  void tokens(int64_t step, int64_t first, int64_t n, int32_t* ids, int32_t* labels,
              int32_t* positions = nullptr) const;
  /// The file's samples first .. first + n - 1 in file order (a preference file's
  /// precomputed reference goes over them once).
  void file_tokens(int64_t first, int64_t n, int32_t* ids, int32_t* labels) const;
  /// Whether the file's rows are packed: it has position_ids, each row documents that are
  /// runs of positions 0, 1, 2, ... (checked when read; the label at a document's first
  /// position is ignored, whatever the file says).
  bool packed() const { return !positions_.empty(); }
  /// The count the loss of `step`'s global batch is divided by: mse, its elements; sum, 1;
  /// tokens, its labels that are scored (not -100, past position 0). Every rank computes
  /// it alone.
  double normaliser(int64_t step, bool mse) const;

  /// The count the loss over every row of the file is divided by (evaluation, as
  /// normaliser() for one step).
  double file_normaliser(bool mse) const;
  /// Samples of the file (0 for synthetic data): its rows, or its pairs (form()).
  int64_t rows() const { return rows_; }
  /// The file's root attribute `form`: "" (SFT rows) or "pairs" (a preference pair a
  /// sample: file rows 2i, 2i + 1 its chosen and rejected; spec().rows_per_sample 2).
  const std::string& form() const { return form_; }
  /// The tokens of the chosen rows of `step`'s global batch of pairs, and of the first
  /// `samples` pairs of the file, from position 1 to the last scored label: the prompt's
  /// and the completion's (ORPO's cross-entropy is over them, as TRL's).
  double chosen_tokens(int64_t step) const;
  double file_chosen_tokens(int64_t samples) const;

  bool synthetic() const { return path_.empty(); }
  /// The model's InputSpec with the file's sequence length (token models whose spec
  /// leaves it open, seq_len 0).
  const InputSpec& spec() const { return spec_; }
  /// The file's sample (row, or pair) that sample i of `step`'s global batch is.
  int64_t sample_of(int64_t step, int64_t i) const { return row_of(step * global_bs_ + i); }
  /// A content hash of the token file's ids and labels (its identity for side files).
  std::string content_hash() const;
  /// Global sample index of sample `first` of `step` (the counter of synthetic rows).
  int64_t global_sample(int64_t step, int64_t first) const { return step * global_bs_ + first; }
  const std::string& path() const { return path_; }
  /// False for a file in HDF5's older format (h5py's default), whose metadata carries no
  /// checksum: damage to it cannot be detected (docs/RELIABILITY.md).
  bool metadata_checksummed() const { return checksummed_; }

 private:
  std::string path_;
  InputSpec spec_;
  int64_t global_bs_, rows_ = 0;
  uint64_t seed_;
  bool shuffle_ = false, checksummed_ = true;
  // The permutations of the epochs in use (a step may straddle two).
  mutable std::vector<std::pair<int64_t, std::vector<int64_t>>> perms_;
  std::vector<float> inputs_, targets_;
  std::vector<int32_t> ids_, labels_, positions_;
  std::vector<std::string> notes_;
  std::string form_;
  /// The scored labels of file row r (positions 1 ..).
  int64_t scored_in_row(int64_t r) const;
  /// The file row of global sample g.
  int64_t row_of(int64_t g) const;
  template <class T>
  void fill(const std::vector<T>& src, int64_t width, int64_t step, int64_t first, int64_t n,
            T* out) const;
};

}  // namespace kqlora
