#pragma once
// The test-only second model (token_mlp_model.cpp): registers model kind "test_token_mlp".

#include "kqlora/nn/model_config.hpp"
#include "kqlora/nn/param_table.hpp"

namespace tokenmlp {

constexpr int64_t kVocab = 24, kSeqLen = 6;

kqlora::ParamTable make_table(const kqlora::ModelConfig& cfg);
void register_token_mlp();

}  // namespace tokenmlp
