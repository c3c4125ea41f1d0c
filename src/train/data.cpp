#include "kqlora/train/data.hpp"

#include <algorithm>
#include <cstring>

#include "kqlora/build_config.hpp"
#include "kqlora/core/content_hash.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/memory_budget.hpp"
#include "kqlora/core/random.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/hdf5_file.hpp"
#endif

namespace kqlora {

namespace {

// A file's declared shape may promise more than the file holds (chunks never written read
// as zeros): what it asks to be read into memory is bounded by the node's memory first.
void check_fits(int64_t bytes, const std::string& where) {
  const MemoryBudget b = node_memory();
  KQLORA_INPUT_CHECK(b.bytes <= 0 || bytes <= b.bytes,
                     where << ": its datasets declare " << human_bytes(static_cast<double>(bytes))
                           << ", more than this node's memory (" << b.source << ")");
}

/// A dataset's dimensions for a message: "rows x cols", or how many there are.
std::string dims_text(const std::vector<int64_t>& d) {
  return d.size() == 2 ? std::to_string(d[0]) + " x " + std::to_string(d[1])
                       : std::to_string(d.size()) + " dimensions";
}

#if KQLORA_HAVE_HDF5
/// An integer dataset [rows, T] as int32: float data is refused (it would be truncated),
/// and a 64-bit value outside int32 is named with its real value (HDF5's conversion would
/// clamp it).
void read_token_dataset(const h5::Handle& f, const char* name, const std::string& path,
                        const std::string& where, int64_t rows, int64_t T,
                        std::vector<int32_t>& out) {
  H5T_class_t cls = H5T_NO_CLASS;
  size_t size = 0;
  h5::dataset_type(f, name, &cls, &size);
  KQLORA_INPUT_CHECK(cls == H5T_INTEGER,
                     where << ": dataset '" << name << "' holds "
                           << (cls == H5T_FLOAT ? "floating-point numbers" : "non-integer data")
                           << ": token ids, labels and positions must be integers (int32 or "
                              "int64), not truncated silently");
  const size_t n = static_cast<size_t>(rows * T);
  out.resize(n);
  // Signed integers of up to 32 bits convert exactly: read straight into place (the
  // common case, tools/tokenize_sft.py's int32). Wider or unsigned 32-bit ones go through
  // an int64 copy (a rare file: its memory is checked), so that a value past int32 is
  // named, not clamped.
  h5::Handle d(KQLORA_H5(H5Dopen2(f, name, H5P_DEFAULT)));
  h5::Handle type(KQLORA_H5(H5Dget_type(d)));
  const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  if (size < 4 || (size == 4 && is_signed)) {
    h5::read_dataset(f, name, H5T_NATIVE_INT32, rows * T, out.data(), path);
    return;
  }
  check_fits(rows * T * 16, where);
  std::vector<int64_t> wide(n);
  h5::read_dataset(f, name, H5T_NATIVE_INT64, rows * T, wide.data(), path);
  for (size_t i = 0; i < n; ++i) {
    KQLORA_INPUT_CHECK(wide[i] >= INT32_MIN && wide[i] <= INT32_MAX,
                       where << ": " << name << "[" << i / T << ", " << i % T << "] = " << wide[i]
                             << " is outside the range of token ids, labels and positions");
    out[i] = static_cast<int32_t>(wide[i]);
  }
}

/// A packed file's position_ids [rows, T], checked: each row's documents are runs of
/// positions 0, 1, 2, ... (padding after the last one: positions 0). The label at each
/// position 0 becomes -100: it would be scored by the previous document's last token
/// (docs/MODELS.md, "Data files"), whatever the file says.
std::vector<int32_t> read_positions(const h5::Handle& f, const std::string& path,
                                    const std::string& where, int64_t rows, int64_t T,
                                    std::vector<int32_t>& labels, int64_t* dropped) {
  const auto d = h5::dataset_dims(f, "position_ids", path);
  KQLORA_INPUT_CHECK(d == (std::vector<int64_t>{rows, T}),
                     where << ": dataset 'position_ids' must be [" << rows << ", " << T
                           << "] as input_ids, got " << dims_text(d));
  std::vector<int32_t> positions;
  read_token_dataset(f, "position_ids", path, where, rows, T, positions);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* p = positions.data() + r * T;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t next = t == 0 ? 0 : p[t - 1] + 1;
      KQLORA_INPUT_CHECK(p[t] == 0 || p[t] == next,
                         where << ": position_ids[" << r << ", " << t << "] = " << p[t]
                               << " where 0 (a document's first token, or padding) or " << next
                               << " (the next position of its document) was expected: a "
                                  "document is a run of positions 0, 1, 2, ...");
      if (p[t] != 0) continue;
      // (t = 0 was counted by the caller: any row's first label)
      *dropped += t > 0 && labels[r * T + t] != kIgnoreLabel;
      labels[r * T + t] = kIgnoreLabel;
    }
  }
  return positions;
}

/// A file that scores no label would train nothing (or evaluate to a loss of 0): refused.
/// Rows that score nothing are kept -- the step-to-rows mapping, resumes and references
/// stay as they are -- and counted once in a note.
void check_scored(const std::string& where, const std::string& what, int64_t rows, int64_t T,
                  const std::vector<int32_t>& labels, int64_t first_labels,
                  std::vector<std::string>* notes) {
  int64_t unscored = 0;
  for (int64_t r = 0; r < rows; ++r) {
    bool any = false;
    for (int64_t t = 1; t < T && !any; ++t) any = labels[r * T + t] != kIgnoreLabel;
    unscored += !any;
  }
  KQLORA_INPUT_CHECK(
      unscored < rows,
      where << ": no label is scored"
            << (first_labels > 0
                    ? ": its " + std::to_string(first_labels) +
                          " labels are all at a document's first position (position 0 of a "
                          "row, or position_ids 0), which nothing before it predicts"
                    : std::string(": every label is -100"))
            << "; "
            << (what == "eval_file" ? "its loss would read 0" : "the run would learn nothing")
            << " (tools/tokenize_sft.py scores the assistant's turns; docs/MODELS.md, \"Data "
               "files\")");
  if (unscored > 0)
    notes->push_back("note: " + where + ": " + std::to_string(unscored) + " of " +
                     std::to_string(rows) +
                     " rows score no label (kept: they count nothing in the loss)");
}

/// A token file made with another tokenizer than hf_model_dir's is refused; a file or a
/// model without the hash, or tokenizer_check = off, is a note.
void check_tokenizer(const h5::Handle& f, const std::string& where, const TokenFileChecks& checks,
                     std::vector<std::string>* notes) {
  if (!checks.tokenizer_check) {
    notes->push_back("note: " + where + ": tokenizer_check = off: its tokenizer is not compared");
    return;
  }
  const std::string file_sha = h5::has_attribute(f, "tokenizer_sha256")
                                   ? h5::read_string_attribute(f, "tokenizer_sha256", where)
                                   : std::string();
  if (file_sha.empty()) {
    notes->push_back("note: " + where +
                     ": no tokenizer_sha256 attribute: its tokenizer is not compared with the "
                     "model's");
    return;
  }
  if (checks.tokenizer.sha256.empty()) {
    notes->push_back("note: " + where +
                     ": hf_model_dir has no tokenizer.json or tokenizer.model: the file's "
                     "tokenizer_sha256 is not compared");
    return;
  }
  KQLORA_INPUT_CHECK(file_sha == checks.tokenizer.sha256,
                     where << ": made with another tokenizer: its tokenizer_sha256 " << file_sha
                           << " is not the SHA-256 " << checks.tokenizer.sha256 << " of "
                           << checks.tokenizer.file
                           << " (tokenize the data again with tools/tokenize_sft.py --model "
                              "for this model, or set tokenizer_check = off if the ids are "
                              "the same)");
}
#endif

}  // namespace

int64_t token_file_seq_len(const std::string& path) {
#if KQLORA_HAVE_HDF5
  if (path.empty()) return 0;
  h5::InputFileScope scope(path);
  auto f = h5::open_file(path);
  if (!h5::exists(f, "input_ids")) return 0;
  const auto d = h5::dataset_dims(f, "input_ids", path);
  return d.size() == 2 ? d[1] : 0;
#else
  (void)path;
  return 0;
#endif
}

DataSource::DataSource(const std::string& path, const InputSpec& spec, int64_t global_bs,
                       uint64_t seed, const std::string& what, bool shuffle,
                       const TokenFileChecks& checks)
    : path_(path), spec_(spec), global_bs_(global_bs), seed_(seed), shuffle_(shuffle) {
  if (path.empty()) return;
#if KQLORA_HAVE_HDF5
  h5::InputFileScope scope(path);
  auto f = h5::open_file(path);
  checksummed_ = h5::metadata_checksummed(f);
  const std::string where = what + " " + path;
  if (spec.tokens) {
    if (spec_.seq_len == 0 && h5::exists(f, "input_ids")) {
      const auto d = h5::dataset_dims(f, "input_ids", path);
      KQLORA_INPUT_CHECK(d.size() == 2 && d[1] >= 2,
                         where << ": dataset 'input_ids' must be [rows, positions] with at least "
                                  "2 positions, got "
                               << dims_text(d));
      spec_.seq_len = d[1];
    }
    if (h5::has_attribute(f, "vocab_size")) {
      const auto v = h5::read_int_attribute(f, "vocab_size", path);
      KQLORA_INPUT_CHECK(v.size() == 1 && v[0] == spec.vocab,
                         where << ": attribute vocab_size " << (v.empty() ? -1 : v[0])
                               << " differs from the model's vocabulary of " << spec.vocab
                               << " (tokenized for another model?)");
    }
    const int64_t T = spec_.seq_len;
    for (const char* name : {"input_ids", "labels"}) {
      KQLORA_INPUT_CHECK(h5::exists(f, name), where << ": dataset '" << name << "' is missing");
      const auto d = h5::dataset_dims(f, name, path);
      KQLORA_INPUT_CHECK(
          d.size() == 2 && d[1] == T && d[0] > 0 && T > 0,
          where << ": dataset '" << name << "' must be [rows, " << T << "], got " << dims_text(d));
      rows_ = d[0];
    }
    check_fits(rows_ * T * 8, where);
    read_token_dataset(f, "input_ids", path, where, rows_, T, ids_);
    read_token_dataset(f, "labels", path, where, rows_, T, labels_);
    int64_t first_labels = 0;  // labels at a document's first position: never scored
    for (int64_t r = 0; r < rows_; ++r) first_labels += labels_[r * T] != kIgnoreLabel;
    if (h5::exists(f, "position_ids"))
      positions_ = read_positions(f, path, where, rows_, T, labels_, &first_labels);
    for (size_t i = 0; i < ids_.size(); ++i) {
      KQLORA_INPUT_CHECK(ids_[i] >= 0 && ids_[i] < spec.vocab,
                         where << ": input_ids[" << i / T << ", " << i % T << "] = " << ids_[i]
                               << " is outside the model's vocabulary [0, " << spec.vocab << ")");
      KQLORA_INPUT_CHECK(labels_[i] == kIgnoreLabel || (labels_[i] >= 0 && labels_[i] < spec.vocab),
                         where << ": labels[" << i / T << ", " << i % T << "] = " << labels_[i]
                               << " is neither -100 nor in [0, " << spec.vocab << ")");
    }
    check_scored(where, what, rows_, T, labels_, first_labels, &notes_);
    check_tokenizer(f, where, checks, &notes_);
    if (h5::has_attribute(f, "form")) form_ = h5::read_string_attribute(f, "form", where);
    KQLORA_INPUT_CHECK(form_.empty() || form_ == "pairs",
                       where << ": attribute form = \"" << form_
                             << "\" is not a form kqlora reads (\"pairs\": preference pairs; "
                                "KTO's unpaired rows are not read yet)");
    if (form_ == "pairs") {
      KQLORA_INPUT_CHECK(rows_ % 2 == 0, where << ": form \"pairs\" with " << rows_
                                               << " rows: a pair is two rows (chosen, rejected)");
      KQLORA_INPUT_CHECK(positions_.empty(),
                         where << ": packed preference pairs (position_ids) are not read: a "
                                  "pair's rows are one sample");
      for (int64_t r = 0; r < rows_; ++r)
        KQLORA_INPUT_CHECK(scored_in_row(r) > 0,
                           where << ": pair " << r / 2 << "'s " << (r % 2 ? "rejected" : "chosen")
                                 << " row (row " << r
                                 << ") scores nothing: each side of a pair needs its completion");
      spec_.rows_per_sample = 2;
      rows_ /= 2;
    }
    return;
  }
  const int64_t dim = spec.features;
  const auto dims = h5::dataset_dims(f, "inputs", path);
  KQLORA_INPUT_CHECK(
      dims.size() == 2 && dims[1] == dim && dims[0] > 0,
      where << ": dataset 'inputs' must be [rows, " << dim << "], got " << dims_text(dims));
  rows_ = dims[0];
  check_fits(rows_ * dim * (spec.target_features > 0 ? 8 : 4), where);
  inputs_.resize(static_cast<size_t>(rows_ * dim));
  h5::read_dataset(f, "inputs", H5T_NATIVE_FLOAT, rows_ * dim, inputs_.data(), path);
  if (spec.target_features > 0) {
    KQLORA_INPUT_CHECK(h5::exists(f, "targets"),
                       where << ": loss = mse needs a dataset 'targets' [rows, dim]");
    const auto td = h5::dataset_dims(f, "targets", path);
    KQLORA_INPUT_CHECK(td == (std::vector<int64_t>{rows_, spec.target_features}),
                       where << ": 'targets' must have the shape of 'inputs'");
    targets_.resize(static_cast<size_t>(rows_ * spec.target_features));
    h5::read_dataset(f, "targets", H5T_NATIVE_FLOAT, rows_ * spec.target_features, targets_.data(),
                     path);
  }
#else
  (void)spec;
  KQLORA_INPUT_CHECK(false, what << " " << path << ": this kqlora was built without HDF5");
#endif
}

int64_t DataSource::row_of(int64_t g) const {
  const int64_t epoch = g / rows_, i = g % rows_;
  if (!shuffle_) return i;
  for (const auto& [e, perm] : perms_)
    if (e == epoch) return perm[i];
  if (perms_.size() == 2) perms_.erase(perms_.begin());
  std::vector<int64_t> perm(static_cast<size_t>(rows_));
  for (int64_t k = 0; k < rows_; ++k) perm[k] = k;
  const uint64_t stream = static_cast<uint64_t>(RandomStream::shuffle) + epoch;
  for (int64_t k = rows_ - 1; k > 0; --k) {  // Fisher-Yates
    const uint64_t j = random_bits(seed_, stream, static_cast<uint64_t>(k)) % (k + 1);
    std::swap(perm[k], perm[j]);
  }
  perms_.emplace_back(epoch, std::move(perm));
  return perms_.back().second[i];
}

template <class T>
void DataSource::fill(const std::vector<T>& src, int64_t width, int64_t step, int64_t first,
                      int64_t n, T* out) const {
  KQLORA_CHECK(!path_.empty(),
               "DataSource: synthetic rows are generated on the device "
               "(fill_normal_rows), not read");
  const int64_t w = width * spec_.rows_per_sample;  // (a sample's rows, consecutive)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = step * global_bs_ + first + i;  // global sample index over the run
    std::memcpy(out + i * w, src.data() + row_of(g) * w, sizeof(T) * w);
  }
}

void DataSource::inputs(int64_t step, int64_t first, int64_t n, float* out) const {
  fill(inputs_, spec_.features, step, first, n, out);
}

void DataSource::targets(int64_t step, int64_t first, int64_t n, float* out) const {
  fill(targets_, spec_.target_features, step, first, n, out);
}

void DataSource::file_tokens(int64_t first, int64_t n, int32_t* ids, int32_t* labels) const {
  const int64_t w = spec_.seq_len * spec_.rows_per_sample;
  std::memcpy(ids, ids_.data() + first * w, sizeof(int32_t) * n * w);
  std::memcpy(labels, labels_.data() + first * w, sizeof(int32_t) * n * w);
}

void DataSource::tokens(int64_t step, int64_t first, int64_t n, int32_t* ids, int32_t* labels,
                        int32_t* positions) const {
  const int64_t T = spec_.seq_len;
  if (!synthetic()) {
    fill(ids_, T, step, first, n, ids);
    fill(labels_, T, step, first, n, labels);
    if (positions != nullptr && packed()) fill(positions_, T, step, first, n, positions);
    return;
  }
  for (int64_t i = 0; i < n * T; ++i) {
    const uint64_t index = static_cast<uint64_t>(global_sample(step, first) * T + i);
    ids[i] = static_cast<int32_t>(
        random_uniform(seed_, static_cast<uint64_t>(RandomStream::inputs), index) *
        static_cast<double>(spec_.vocab));
    labels[i] = ids[i];
  }
}

double DataSource::normaliser(int64_t step, bool mse) const {
  if (!spec_.tokens) return mse ? static_cast<double>(global_bs_ * spec_.target_features) : 1.0;
  const int64_t T = spec_.seq_len;
  if (synthetic()) return static_cast<double>(global_bs_ * (T - 1));
  const int64_t ps = spec_.rows_per_sample;
  int64_t n = 0;
  for (int64_t i = 0; i < global_bs_; ++i)
    for (int64_t k = 0; k < ps; ++k) n += scored_in_row(row_of(step * global_bs_ + i) * ps + k);
  return static_cast<double>(n);
}

int64_t DataSource::scored_in_row(int64_t r) const {
  const int64_t T = spec_.seq_len;
  int64_t n = 0;
  for (int64_t t = 1; t < T; ++t) n += labels_[r * T + t] != kIgnoreLabel;
  return n;
}

namespace {
/// Positions 1 .. the last scored label of a row (0: none scored).
int64_t tokens_to_last_label(const int32_t* labels, int64_t T) {
  for (int64_t t = T - 1; t >= 1; --t)
    if (labels[t] != kIgnoreLabel) return t;
  return 0;
}
}  // namespace

double DataSource::chosen_tokens(int64_t step) const {
  const int64_t T = spec_.seq_len;
  int64_t n = 0;
  for (int64_t i = 0; i < global_bs_; ++i)
    n += tokens_to_last_label(labels_.data() + row_of(step * global_bs_ + i) * 2 * T, T);
  return static_cast<double>(n);
}

double DataSource::file_chosen_tokens(int64_t samples) const {
  const int64_t T = spec_.seq_len;
  int64_t n = 0;
  for (int64_t i = 0; i < samples; ++i) n += tokens_to_last_label(labels_.data() + i * 2 * T, T);
  return static_cast<double>(n);
}

std::string DataSource::content_hash() const {
  ContentHash h;
  h.add(ids_.data(), sizeof(int32_t) * ids_.size());
  h.add(labels_.data(), sizeof(int32_t) * labels_.size());
  h.add(form_);
  return h.hex();
}

double DataSource::file_normaliser(bool mse) const {
  if (!spec_.tokens) return mse ? static_cast<double>(rows_ * spec_.target_features) : 1.0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows_ * spec_.rows_per_sample; ++r) n += scored_in_row(r);
  return static_cast<double>(n);
}

}  // namespace kqlora
