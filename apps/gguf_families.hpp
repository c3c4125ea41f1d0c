#pragma once
// How kqlora's decoder families are written for llama.cpp (docs/GGUF.md, "Families"): the
// architecture llama.cpp runs each as, its metadata keys, its tensor names and the
// transforms its converter applies (the Q/K row order of llama, smollm3 and granite,
// Gemma's and Qwen3.5's norms as w + 1, Qwen3.5's Gated DeltaNet value heads reordered
// and A_log stored as -exp(A_log), Qwen3-Next's in_proj_qkvz split into attn_qkv and
// attn_gate, Gemma 4's proportional rope as rope_freqs), and what llama.cpp cannot
// express -- refused, naming the config.json field and value, rather than written to run
// differently. This is the one place outside nn/ that knows families by name: llama.cpp's
// names are per architecture by its design.

#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/io/gguf_writer.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::exporter {

/// One checkpoint tensor as llama.cpp reads it.
struct GgufTensorPlan {
  std::string name;            // llama.cpp's
  int64_t permute_heads = 0;   // > 0: llama's rotary row order over this many heads
  bool plus_one = false;       // Gemma's and Qwen3.5's (1 + w) norms stored as w + 1
  int64_t expert = -1;         // >= 0: this expert's slice of a stacked [E, out, in] tensor
  bool as_vector = false;      // a [1, n] matrix stored as the vector [n]
  bool keep_f32 = false;       // F32 whatever the type (routers: llama.cpp's converter keeps them)
  bool neg_exp = false;        // Gated DeltaNet's A_log stored as -exp(A_log) (ssm_a)
  std::vector<int64_t> shape;  // non-empty: the shape written (conv1d's [conv_dim, kernel])
  // Gated DeltaNet's value heads from grouped order (key head g's value heads j = 0..r-1
  // together) to tiled order (j-th of every key head together), as llama.cpp's converter
  // writes them for ggml's broadcast of the key heads: `v_unit` rows a head (or columns,
  // `v_columns`: out_proj's input) from row `v_from` on; `v_groups` key heads of r each.
  int64_t v_unit = 0;  // 0: none
  int64_t v_from = 0, v_groups = 0, v_per_group = 0;
  bool v_columns = false;
  // Non-empty: the checkpoint tensor's rows written, in this order (one of the tensors a
  // fused projection is split into: Qwen3-Next's in_proj_qkvz as attn_qkv and attn_gate).
  std::vector<int64_t> rows;
};

/// A decoder as llama.cpp runs it.
struct GgufDecoder {
  std::string arch;  // general.architecture
  // rope_freqs.weight, the divisors of the base frequencies: llama's (llama3-style) or
  // gemma4's full-attention layers' (proportional rope: 1e30 where a frequency is 0, as
  // llama.cpp's converter); empty: none
  std::vector<float> rope_freqs;

  /// Adds the architecture's hyperparameter keys ("<arch>.*") to w.
  void add_metadata(gguf::Writer& w) const;
  /// The plans of the Hugging Face tensor `hf`: one, or one per llama.cpp tensor it is
  /// split into (gguf_decoder has refused the tensors llama.cpp has no place for);
  /// InputError naming `file` for a name it does not know.
  std::vector<GgufTensorPlan> tensors(const std::string& hf, const std::string& file) const;
  /// The plan of a tensor written whole (tensors() when it gives one).
  GgufTensorPlan tensor(const std::string& hf, const std::string& file) const;

  DecoderSpec spec;
  // What the metadata says where the spec alone does not (see gguf_decoder()).
  float rope_scale = 1.0f;     // linear rope scaling factor (1: none)
  int64_t window = 0;          // the sliding window of the windowed layers
  bool pattern_array = false;  // gemma3: the layers' windows as a bool array
  // YaRN (smollm3, olmo2): the factor (0: none), the original context and the factor on
  // cos and sin that llama.cpp applies besides its own 1 + 0.1 ln(factor) (1: none)
  float yarn_factor = 0;
  int64_t yarn_original = 0;
  float yarn_attn_factor = 1.0f;
  // qwen35, qwen35moe: rope.dimension_sections (mrope's four sections, the last 0); they
  // and qwen3next: the layer pattern as full_attention_interval (every n-th layer full
  // attention) or, where no interval gives it (0), attention.recurrent_layers (a bool a
  // layer)
  std::vector<int32_t> rope_sections;
  int64_t full_attention_interval = 0;
  // gemma4: the last layers attending over an earlier layer's keys and values
  // (attention.shared_kv_layers)
  int64_t shared_kv_layers = 0;
};

/// llama.cpp's view of `spec` (config.json's text `config_text`, `file` naming the
/// checkpoint in messages), or InputError (exit 2) naming the config.json field and value
/// that llama.cpp cannot express for its architecture.
GgufDecoder gguf_decoder(const DecoderSpec& spec, const std::string& config_text,
                         const std::string& file);

}  // namespace kqlora::exporter
