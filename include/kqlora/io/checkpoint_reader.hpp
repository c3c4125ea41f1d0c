#pragma once
// A checkpoint read where its values are needed: the files' attributes and NF4 base
// weights at opening, every float tensor and optimizer state left in the file and indexed
// (which file, which dataset, which elements of the flattened tensor), then read range by
// range straight into its destination. A restart reads each rank's part of the
// parameters and optimizer state this way, into the memory they live in from then on
// (no whole copy of the state per rank; docs/CHECKPOINTS.md).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/io/checkpoint_contents.hpp"
#include "kqlora/io/hdf5_file.hpp"

namespace kqlora {

class CheckpointReader {
 public:
  /// Opens the checkpoint files `path` names (checkpoint_files: any layout, world size and
  /// parallel mode) and checks them as read_checkpoint_file and assemble_checkpoint do:
  /// FSDP shards of the base weights are gathered, and the slices of every float tensor
  /// must cover it exactly. Errors name the file and the object.
  explicit CheckpointReader(const std::string& path);

  /// Attributes and whole NF4 base weights; `params` lists every float tensor whole
  /// (name and shape, data empty); `optimizer` names every state (values empty).
  const CheckpointContents& contents() const { return contents_; }

  /// Elements [lo, hi) of the flattened parameter `name` into dst.
  void read_param(const std::string& name, int64_t lo, int64_t hi, float* dst) const;
  /// Elements [lo, hi) of optimizer state `state` of parameter `name` into dst.
  void read_state(const std::string& name, const std::string& state, int64_t lo, int64_t hi,
                  float* dst) const;
  bool has_state(const std::string& name, const std::string& state) const;

 private:
  struct Piece {
    int file = 0;
    std::string dataset;           // e.g. "params/layers.0.lora_a.weight"
    int64_t first = 0, count = 0;  // elements [first, first + count) of the tensor
  };
  std::vector<std::string> paths_;
  std::vector<h5::Handle> files_;
  CheckpointContents contents_;
  std::map<std::string, std::vector<Piece>> pieces_;  // "params/<name>", "optimizer/<name>/<state>"

  void read(const std::string& key, int64_t lo, int64_t hi, float* dst) const;
};

}  // namespace kqlora
