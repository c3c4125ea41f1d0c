#pragma once
// Model initialisation: every tensor from the counter-based generator (core/random.hpp;
// docs/TRAINING.md, "The model"), unless the init_file (HDF5 in the checkpoint schema, float
// datasets or NF4 groups; or a safetensors file keyed by parameter name) provides it.

#include <iosfwd>
#include <string>

#include "kqlora/nn/model.hpp"

namespace kqlora {

/// A trainable parameter's values from the seed by its InitRule (row-major, float32).
/// Frozen tensors' normal values are generated in place (fill_normal) before quantization.
std::vector<float> seed_values(const ModelConfig& cfg, const ParamEntry& p);

/// The weights file of a Hugging Face model directory: model.safetensors, or the index of
/// a sharded one (model.safetensors.index.json); when it has neither, "" if `optional`,
/// else InputError.
std::string hf_weights_file(const std::string& dir, bool optional = false);

/// The trainable parameters a run starts from (the flat layout of the table): the
/// init_file's where it has them, else the seed's -- what initialize_model writes, without
/// the base. A preference objective's frozen reference (train/preference_loss.hpp) is the
/// base with these adapters, at the start and on every restart.
std::vector<float> starting_trainables(const ModelConfig& cfg, const ParamTable& table,
                                       const std::string& init_file);

/// Fills every tensor of the model's table; notes what came from where on `log`.
template <class ExecSpace>
void initialize_model(const ExecSpace& exec, Model<ExecSpace>& model, const std::string& init_file,
                      std::ostream& log);

}  // namespace kqlora
