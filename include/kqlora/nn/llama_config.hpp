#pragma once
// The architecture of a Llama-family model, read from a Hugging Face config.json
// (docs/MODELS.md lists the fields read and what is refused), and the rotary embedding's
// inverse frequencies it implies.

#include <cstdint>
#include <string>
#include <vector>

namespace kqlora {

struct LlamaArch {
  std::string model_type;  // llama | mistral
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  std::string rope_type = "default";  // default | llama3
  double rope_factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_positions = 0;  // llama3
  int64_t max_positions = 0;
  int64_t sliding_window = 0;  // mistral: 0 for none
  bool tied = false;
  /// Notes for the log (e.g. defaults taken).
  std::vector<std::string> notes;

  int64_t q_features() const { return heads * head_dim; }
  int64_t kv_features() const { return kv_heads * head_dim; }
};

/// Parses config.json's text; InputError naming `source`, the field and the value for
/// anything missing, malformed or unsupported.
LlamaArch parse_llama_config(const std::string& text, const std::string& source);

/// inv_freq_i for i < head_dim / 2, in float32 arithmetic as transformers computes it
/// (rope type default, or llama3's frequency scaling).
std::vector<float> rope_inv_freq(const LlamaArch& a);

}  // namespace kqlora
