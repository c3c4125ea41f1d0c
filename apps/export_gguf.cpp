// kqlora-export --gguf: a checkpoint of a Hugging Face decoder as a GGUF file for
// llama.cpp (docs/GGUF.md, "The export"): llama.cpp's tensor and metadata names, its Q/K
// row order, the weights merged onto the dequantized NF4 they were trained on (or that
// base alone), one tensor in memory at a time.

#include <iostream>
#include <map>
#include <regex>

#include "export_writers.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/io/gguf_writer.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::exporter {

namespace {

/// llama.cpp's name for a Hugging Face tensor of the llama architecture ("" when none).
std::string llama_cpp_name(const std::string& hf) {
  static const std::map<std::string, std::string> block = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.*))");
  std::smatch m;
  if (std::regex_match(hf, m, layer)) {
    const auto it = block.find(m[2].str());
    if (it != block.end()) return "blk." + m[1].str() + "." + it->second;
  }
  return "";
}

/// llama.cpp's converter's row order for q_proj and k_proj of the llama architecture: each
/// head's rows (first half, second half) interleaved, as its rotary pairs adjacent dims.
std::vector<float> permute_rows(const std::vector<float>& w, int64_t out, int64_t in,
                                int64_t heads) {
  const int64_t hd = out / heads, half = hd / 2;
  std::vector<float> p(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j) {
        const int64_t from = h * hd + i * half + j, to = h * hd + j * 2 + i;
        std::copy_n(w.begin() + from * in, in, p.begin() + to * in);
      }
  return p;
}

const json::Value* field(const json::Value& doc, const std::string& key) {
  for (const auto& [k, v] : doc.object)
    if (k == key) return &v;
  return nullptr;
}

}  // namespace

void write_gguf(const CheckpointContents& c, const std::string& file, const std::string& out,
                gguf::TensorType type, bool merge) {
  KQLORA_INPUT_CHECK(!c.arch_text.empty(),
                     file << ": --gguf needs a model imported from a Hugging Face directory");
  const DecoderSpec spec = parse_decoder_config(c.arch_text, file + ": hf_config");
  KQLORA_INPUT_CHECK(spec.model_type == "llama",
                     file << ": --gguf: model_type '" << spec.model_type
                          << "' is not yet written (llama only so far; docs/GGUF.md)");
  const json::Value cfg = json::parse(c.arch_text, file + ": hf_config");
  for (const char* unsupported : {"rope_scaling", "attention_bias", "mlp_bias"}) {
    const json::Value* v = field(cfg, unsupported);
    KQLORA_INPUT_CHECK(v == nullptr || v->kind == json::Value::Kind::null ||
                           (v->kind == json::Value::Kind::boolean && !v->boolean),
                       file << ": --gguf: config.json's " << unsupported << " = " << json::write(*v)
                            << " is not yet written (docs/GGUF.md)");
  }
  // rope_theta at the top (transformers 4) or in rope_parameters (5), whose rope_type must
  // be the default one: llama.cpp's other ropes need tensors and keys not written yet.
  const json::Value* theta = field(cfg, "rope_theta");
  const json::Value* params = field(cfg, "rope_parameters");
  if (params && params->kind == json::Value::Kind::object) {
    const json::Value* kind = field(*params, "rope_type");
    KQLORA_INPUT_CHECK(
        !kind || (kind->kind == json::Value::Kind::string && kind->string == "default"),
        file << ": --gguf: config.json's rope_parameters.rope_type = " << json::write(*kind)
             << " is not yet written (docs/GGUF.md)");
    if (!theta) theta = field(*params, "rope_theta");
  }
  const float rope_base = theta && theta->kind == json::Value::Kind::number
                              ? static_cast<float>(theta->number)
                              : 10000.0f;

  gguf::Writer w;
  w.add("general.architecture", "llama");
  w.add("general.type", "model");
  w.add("general.name", std::string(merge ? "kqlora fine-tune" : "kqlora NF4 base") + " (step " +
                            std::to_string(c.step) + ")");
  w.add_u32("general.alignment", 32);
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(spec.vocab));
  w.add_u32("llama.context_length", static_cast<uint32_t>(spec.max_positions));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(spec.hidden));
  w.add_u32("llama.block_count", static_cast<uint32_t>(spec.layers));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(spec.intermediate));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(spec.heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(spec.kv_heads));
  w.add_u32("llama.attention.key_length", static_cast<uint32_t>(spec.head_dim));
  w.add_u32("llama.attention.value_length", static_cast<uint32_t>(spec.head_dim));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(spec.head_dim));
  w.add_f32("llama.rope.freq_base", rope_base);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(spec.norm_eps));
  w.add("tokenizer.ggml.model", "none");

  struct Item {
    const ParamEntry* e;
    int64_t permute_heads;  // 0: as is
  };
  std::vector<Item> items;
  for (const ParamEntry& e : c.table.entries) {
    if (!e.tied_to.empty() || is_adapter_tensor(c, e.name)) continue;
    const std::string name = llama_cpp_name(e.name);
    KQLORA_INPUT_CHECK(!name.empty(), file << ": --gguf: tensor '" << e.name
                                           << "' has no llama.cpp name (docs/GGUF.md)");
    const bool matrix = e.shape.size() == 2;
    const gguf::TensorType t = matrix ? type : gguf::TensorType::f32;  // 1-D: F32, as llama.cpp
    KQLORA_INPUT_CHECK(t != gguf::TensorType::q8_0 || e.shape.back() % 32 == 0,
                       file << ": --gguf-type q8_0: '" << e.name << "' rows of " << e.shape.back()
                            << " values are not whole blocks of 32");
    w.add_tensor(name, e.shape, t);
    // q_proj's rows permuted over the query heads, k_proj's over the key/value heads.
    const auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    items.push_back({&e, ends_with(".attn_q.weight")   ? spec.heads
                         : ends_with(".attn_k.weight") ? spec.kv_heads
                                                       : 0});
  }
  int merged = 0;
  w.write(out, [&](size_t i, std::vector<float>& values) {
    const ParamEntry& e = *items[i].e;
    bool with_adapter = false;
    values = e.kind == ParamKind::nf4 ? weight_values(c, e, file, merge, &with_adapter)
                                      : dense_values(c, e.name, file);
    merged += with_adapter;
    if (items[i].permute_heads > 0)
      values = permute_rows(values, e.shape[0], e.shape[1], items[i].permute_heads);
  });
  std::cout << out << ": GGUF v3, llama, " << w.tensors() << " tensors ("
            << (merge ? std::to_string(merged) + " with their adapters merged"
                      : std::string("the NF4 base dequantized, no adapters"))
            << "; matrices " << gguf::tensor_type_name(type) << ", vectors f32), step " << c.step
            << "\n"
            << out
            << ": note: no tokenizer written yet (tokenizer.ggml.model = none; docs/GGUF.md)\n";
}

}  // namespace kqlora::exporter
