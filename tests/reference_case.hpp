#pragma once
// What the tests of the decoder against transformers' reference cases share
// (tests/data/llama_reference, tests/data/family_reference): a case directory's text
// files, the model keys its reference was made with, and the scale tolerances go by.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kqlora/nn/model_config.hpp"

namespace kqlora_test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// The model of a reference case directory as tools/gen_llama_reference.py made its
/// reference: LoRA rank 4, alpha 8 on `targets`, NF4 blocks of 32, B zero-initialised.
inline kqlora::ModelConfig reference_config(const std::string& dir, const std::string& targets,
                                            kqlora::DType dtype = kqlora::DType::float32) {
  kqlora::ModelConfig m;
  m.kind = "causal_lm";
  m.hf_model_dir = dir;
  m.arch_text = read_text(dir + "/config.json");
  m.arch_source = dir + "/config.json";
  m.lora_targets = targets;
  m.rank = 4;
  m.alpha = 8;
  m.block_size = 32;
  m.scaler_block_size = 32;
  m.dtype = dtype;
  m.loss = kqlora::LossKind::cross_entropy;
  m.lora_b_zeros = true;
  return m;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace kqlora_test
