#include "kqlora/io/checkpoint_reader.hpp"

#include <algorithm>

#include "kqlora/core/error.hpp"
#include "kqlora/io/checkpoint.hpp"

namespace kqlora {

CheckpointReader::CheckpointReader(const std::string& path) : paths_(checkpoint_files(path)) {
  std::vector<CheckpointContents> listed;
  for (const auto& f : paths_) listed.push_back(read_checkpoint_file(f, true, false));
  // A DDP run's files each hold the whole state: the first is read, as assemble does.
  const bool sharded =
      std::any_of(listed.front().params.begin(), listed.front().params.end(),
                  [](const CheckpointTensor& t) { return t.first_element >= 0; }) ||
      !listed.front().nf4_shards.empty();
  if (!sharded) listed.resize(1), paths_.resize(1);
  // The float tensors are indexed here; the rest (attributes, NF4 gathered, the files'
  // agreement) is assemble_checkpoint's.
  std::vector<CheckpointContents> headers = listed;
  for (auto& h : headers) h.params.clear(), h.optimizer.clear();
  contents_ = assemble_checkpoint(headers, path);
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, int64_t> numel;
  for (size_t f = 0; f < listed.size(); ++f) {
    h5::InputFileScope scope(paths_[f]);
    files_.push_back(h5::open_file(paths_[f]));
    std::map<std::string, Piece> slice_of;  // this file's slice of each parameter
    for (const auto& t : listed[f].params) {
      const auto& shape = t.first_element >= 0 ? t.global_shape : t.shape;
      int64_t n = 1, count = 1;
      for (int64_t d : shape) n *= d;
      for (int64_t d : t.shape) count *= d;
      if (!shapes.count(t.name)) {
        shapes[t.name] = shape;
        numel[t.name] = n;
        contents_.params.push_back({t.name, shape, {}});
      }
      KQLORA_INPUT_CHECK(shapes[t.name] == shape, paths_[f] << ": /params/" << t.name
                                                            << " has another shape in "
                                                            << paths_[0]);
      const Piece p{static_cast<int>(f), "params/" + t.name, std::max<int64_t>(0, t.first_element),
                    count};
      pieces_["params/" + t.name].push_back(p);
      slice_of[t.name] = p;
    }
    for (const auto& [key, values] : listed[f].optimizer) {
      (void)values;
      const auto it = slice_of.find(key.first);
      KQLORA_INPUT_CHECK(it != slice_of.end(), paths_[f] << ": optimizer state of '" << key.first
                                                         << "' without its parameter");
      const std::string dataset = "optimizer/" + key.first + "/" + key.second;
      int64_t stored = 1;
      for (int64_t d : h5::dataset_dims(files_.back(), dataset, paths_[f])) stored *= d;
      KQLORA_INPUT_CHECK(stored >= it->second.count, paths_[f] << ": /" << dataset << " has "
                                                               << stored << " elements, "
                                                               << it->second.count << " expected");
      pieces_[dataset].push_back(
          {static_cast<int>(f), dataset, it->second.first, it->second.count});
      if (f == 0) contents_.optimizer.push_back({key, {}});
    }
  }
  // Every tensor covered exactly once by its slices.
  for (auto& [key, pieces] : pieces_) {
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.first < b.first; });
    const std::string name = key.substr(key.find('/') + 1);
    const std::string param = key.rfind("params/", 0) == 0 ? name : name.substr(0, name.rfind('/'));
    int64_t next = 0;
    for (const auto& p : pieces) {
      KQLORA_INPUT_CHECK(p.first == next, path << ": the slices of '" << name
                                               << (p.first < next ? "' overlap" : "' leave a gap")
                                               << " at element " << std::min(p.first, next));
      next += p.count;
    }
    KQLORA_INPUT_CHECK(next == numel[param], path << ": the slices of '" << name << "' cover "
                                                  << next << " of its " << numel[param]
                                                  << " elements");
  }
}

bool CheckpointReader::has_state(const std::string& name, const std::string& state) const {
  return pieces_.count("optimizer/" + name + "/" + state) > 0;
}

void CheckpointReader::read_param(const std::string& name, int64_t lo, int64_t hi,
                                  float* dst) const {
  read("params/" + name, lo, hi, dst);
}

void CheckpointReader::read_state(const std::string& name, const std::string& state, int64_t lo,
                                  int64_t hi, float* dst) const {
  read("optimizer/" + name + "/" + state, lo, hi, dst);
}

void CheckpointReader::read(const std::string& key, int64_t lo, int64_t hi, float* dst) const {
  const auto it = pieces_.find(key);
  KQLORA_INPUT_CHECK(it != pieces_.end(), paths_[0] << ": /" << key << " is missing");
  for (const auto& p : it->second) {
    const int64_t a = std::max(lo, p.first), b = std::min(hi, p.first + p.count);
    if (a >= b) continue;
    h5::InputFileScope scope(paths_[p.file]);
    h5::read_dataset_range(files_[p.file], p.dataset, H5T_NATIVE_FLOAT, a - p.first, b - p.first,
                           dst + (a - lo), paths_[p.file]);
  }
}

}  // namespace kqlora
