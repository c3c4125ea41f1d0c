#pragma once
// Model initialisation: every tensor from the counter-based generator (core/random.hpp;
// docs/TRAINING.md, "The model"), unless the init_file (HDF5 in the checkpoint schema, float
// datasets or NF4 groups; or a safetensors file keyed by parameter name) provides it.

#include <iosfwd>
#include <string>

#include "kqlora/nn/lora_model.hpp"

namespace kqlora {

/// Synthetic values of a trainable parameter (row-major, float32). Base weights are
/// generated in place (fill_normal, stream base_weight + layer) before quantization.
std::vector<float> seed_param_values(const ModelConfig& cfg, const ParamInfo& p);

/// Fills the model's base weights and parameters; notes what came from where on `log`.
template <class ExecSpace>
void initialize_model(const ExecSpace& exec, LoraModel<ExecSpace>& model,
                      const std::string& init_file, std::ostream& log);

}  // namespace kqlora
