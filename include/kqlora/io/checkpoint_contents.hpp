#pragma once
// What a checkpoint holds, in memory (no HDF5 needed to name it: builds without HDF5 use
// it too, to say plainly that they cannot write it).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/nn/param_table.hpp"
#include "kqlora/quant/nf4_shard.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
  /// An FSDP shard holds elements [first_element, first_element + data.size()) of the
  /// flattened tensor of global_shape; first_element < 0: the whole tensor.
  int64_t first_element = -1;
  std::vector<int64_t> global_shape;
  int shard_index = 0, num_shards = 1;
};

struct CheckpointContents {
  /// 2 (written now): HDF5 metadata checksummed (h5::set_checksummed_format); 1 (before
  /// issue 14): readable, but a changed byte of its metadata may pass unnoticed.
  int format_version = 2;
  int64_t step = 0;  // optimizer steps done
  int world_size = 1, rank = 0;
  std::string parallel = "ddp", layout = "per_rank", config_text;
  /// The model's own configuration text (root attribute model_config; ModelConfig), and
  /// the parameter table rebuilt from it when the file is read: all a reader needs to
  /// know the model. Files without the attribute (older kqlora) take it from `config`.
  std::string model_config_text;
  /// A Hugging Face model's config.json text (root attribute hf_config; ModelConfig's
  /// arch_text), empty for models without one.
  std::string arch_text;
  /// checkpoint_base = auto (root attribute base_hash): the frozen base is not stored, only
  /// its identity (io/base_hash.hpp); empty: the base is in the file.
  std::string base_hash;
  /// A preference objective's reference: the hash of the adapters the run started from
  /// (root attribute reference_hash; docs/CHECKPOINTS.md); empty: none.
  std::string reference_hash;
  ParamTable table;
  std::vector<std::pair<std::string, Nf4Tensor<Kokkos::HostSpace>>> nf4;  // frozen base weights
  std::vector<std::pair<std::string, Nf4Shard<Kokkos::HostSpace>>> nf4_shards;  // FSDP
  std::vector<CheckpointTensor> params;  // trainable, float32 masters
  int64_t optimizer_steps = 0;
  /// (parameter name, state name) -> values, e.g. ("layers.0.lora_a.weight", "exp_avg").
  std::vector<std::pair<std::pair<std::string, std::string>, std::vector<float>>> optimizer;
  int64_t seed = 0;
  std::string data_source;  // "synthetic" or the data file's path
};

}  // namespace kqlora
