// kqlora-export --gguf: a checkpoint of a Hugging Face decoder as a GGUF file for
// llama.cpp (docs/GGUF.md, "The export"): llama.cpp's architecture, tensor and metadata
// names for the family (gguf_families.hpp), the tokenizer of the run's hf_model_dir, the
// weights merged onto the dequantized NF4 they were trained on (or that base alone), one
// tensor in memory at a time.

#include <cmath>
#include <iostream>
#include <map>

#include "export_writers.hpp"
#include "gguf_families.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/io/gguf_tokenizer.hpp"
#include "kqlora/nn/decoder_spec.hpp"

namespace kqlora::exporter {

namespace {

/// llama.cpp's converter's row order for q_proj and k_proj of the llama architecture: each
/// head's rows (first half, second half) interleaved, as its rotary pairs adjacent dims.
/// `in` is 1 for a bias.
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

/// Gated DeltaNet's value heads from grouped to tiled order (gguf_families.hpp,
/// GgufTensorPlan::v_unit): of a [rows, cols] tensor, the rows from plan.v_from on (or,
/// v_columns, the columns), each head plan.v_unit of them.
std::vector<float> tile_value_heads(const std::vector<float>& w, int64_t rows, int64_t cols,
                                    const GgufTensorPlan& plan) {
  const int64_t G = plan.v_groups, R = plan.v_per_group, U = plan.v_unit;
  KQLORA_CHECK(G * R * U + plan.v_from == (plan.v_columns ? cols : rows),
               "gguf: value heads do not fill " << plan.name);
  std::vector<float> p(w);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t j = 0; j < R; ++j)
      for (int64_t u = 0; u < U; ++u) {
        const int64_t from = plan.v_from + (g * R + j) * U + u;
        const int64_t to = plan.v_from + (j * G + g) * U + u;
        if (plan.v_columns) {
          for (int64_t r = 0; r < rows; ++r) p[r * cols + to] = w[r * cols + from];
        } else {
          std::copy_n(w.begin() + from * cols, cols, p.begin() + to * cols);
        }
      }
  return p;
}

/// The rows `rows` of a [rows, cols] tensor, in that order (a fused projection's share:
/// GgufTensorPlan::rows).
std::vector<float> select_rows(const std::vector<float>& w, int64_t cols,
                               const std::vector<int64_t>& rows) {
  std::vector<float> p(rows.size() * static_cast<size_t>(cols));
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(w.begin() + rows[r] * cols, cols, p.begin() + static_cast<int64_t>(r) * cols);
  return p;
}

/// general.* naming the model (hf_model_dir's folder name) and, for a fine-tune, its base
/// (llama.cpp's naming keys: name, basename, finetune, base_model.*).
void add_general_names(gguf::Writer& w, const std::string& hf_dir, bool merge, int64_t step) {
  std::string base = hf_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.find_last_of('/') + 1);
  if (base.empty()) base = "model";
  const std::string tuned = "kqlora-lora-step-" + std::to_string(step);
  w.add("general.name", merge ? base + " " + tuned : base + " (its NF4 base, dequantized)");
  w.add("general.basename", base);
  if (!merge) return;
  w.add("general.finetune", tuned);
  w.add_u32("general.base_model.count", 1);
  w.add("general.base_model.0.name", base);
}

}  // namespace

void write_gguf(const CheckpointContents& c, const std::string& file, const std::string& out,
                gguf::TensorType type, bool merge) {
  KQLORA_INPUT_CHECK(!c.arch_text.empty(),
                     file << ": --gguf needs a model imported from a Hugging Face directory");
  const DecoderSpec spec = parse_decoder_config(c.arch_text, file + ": hf_config");
  const GgufDecoder d = gguf_decoder(spec, c.arch_text, file);

  gguf::Writer w;
  w.add("general.architecture", d.arch);
  w.add("general.type", "model");
  const std::string hf_dir = hf_model_dir(c, file);
  add_general_names(w, hf_dir, merge, c.step);
  w.add_u32("general.alignment", 32);
  d.add_metadata(w);
  const GgufTokenizerReport tok = add_gguf_tokenizer(w, hf_dir, spec.vocab, file);

  struct Item {
    const ParamEntry* e;  // null: rope_freqs
    GgufTensorPlan plan;
    std::vector<const ParamEntry*> experts;  // a stacked tensor's, expert by expert
  };
  std::map<std::string, size_t> stacked;  // a stacked tensor's item
  std::vector<Item> items;
  std::string fallbacks;        // q8_0 tensors written as F16
  if (!d.rope_freqs.empty()) {  // llama3-style rope: per-frequency divisors
    w.add_tensor("rope_freqs.weight", {static_cast<int64_t>(d.rope_freqs.size())},
                 gguf::TensorType::f32);
    items.push_back({nullptr, {"rope_freqs.weight"}});
  }
  const auto add_item = [&](const ParamEntry& e, const GgufTensorPlan& plan) {
    if (plan.expert > 0) {  // (expert 0 made the tensor: the hub's order, expert by expert)
      const auto at = stacked.find(plan.name);
      KQLORA_CHECK(at != stacked.end() &&
                       static_cast<int64_t>(items[at->second].experts.size()) == plan.expert,
                   "gguf: experts out of order at " << e.name);
      items[at->second].experts.push_back(&e);
      return;
    }
    const bool matrix = e.shape.size() == 2 && !plan.as_vector;
    gguf::TensorType t =  // 1-D: F32, as llama.cpp
        matrix && !plan.keep_f32 ? type : gguf::TensorType::f32;
    if (t == gguf::TensorType::q8_0 && e.shape.back() % 32 != 0) {
      t = gguf::TensorType::f16;  // rows not whole Q8_0 blocks: F16, as llama.cpp's converter
      fallbacks += (fallbacks.empty() ? "" : ", ") + (plan.expert == 0 ? plan.name : e.name);
    }
    std::vector<int64_t> shape = plan.as_vector ? std::vector<int64_t>{e.numel()} : e.shape;
    if (!plan.shape.empty()) shape = plan.shape;
    if (plan.expert == 0) {  // [E, out, in]
      shape.insert(shape.begin(), d.spec.experts.experts);
      stacked[plan.name] = items.size();
    }
    w.add_tensor(plan.name, shape, t);
    items.push_back({&e, plan, {}});
    if (plan.expert == 0) items.back().experts.push_back(&e);
  };
  for (const ParamEntry& e : c.table.entries) {
    if (!e.tied_to.empty() || is_adapter_tensor(c, e.name)) continue;
    // (a fused projection split into several tensors is merged once for each)
    for (const GgufTensorPlan& plan : d.tensors(e.name, file)) add_item(e, plan);
  }
  for (const auto& [name, at] : stacked)
    KQLORA_CHECK(static_cast<int64_t>(items[at].experts.size()) == d.spec.experts.experts,
                 "gguf: " << name << " lacks experts");
  int merged = 0;
  w.write(out, [&](size_t i, std::vector<float>& values) {
    const Item& it = items[i];
    if (!it.e) {
      values = d.rope_freqs;
      return;
    }
    const ParamEntry& e = *it.e;
    bool with_adapter = false;
    if (!it.experts.empty()) {  // the experts' matrices end to end
      values.clear();
      for (const ParamEntry* x : it.experts) {
        const std::vector<float> v = weight_values(c, *x, file, merge, &with_adapter);
        values.insert(values.end(), v.begin(), v.end());
        merged += with_adapter;
      }
      return;
    }
    values = e.kind == ParamKind::nf4 ? weight_values(c, e, file, merge, &with_adapter)
                                      : dense_values(c, e.name, file);
    // (a fused projection's shares: its adapter counted once, with the share of row 0)
    merged += with_adapter && (it.plan.rows.empty() || it.plan.rows.front() == 0);
    if (!it.plan.rows.empty()) values = select_rows(values, e.numel() / e.shape[0], it.plan.rows);
    if (it.plan.permute_heads > 0)
      values = permute_rows(values, e.shape[0], e.shape.size() == 2 ? e.shape[1] : 1,
                            it.plan.permute_heads);
    if (it.plan.plus_one)
      for (float& v : values) v += 1.0f;
    if (it.plan.neg_exp)
      for (float& v : values) v = -std::exp(v);
    if (it.plan.v_unit > 0)  // (rows: the first dim; columns: the rest, conv1d's kernel)
      values = tile_value_heads(values, e.shape[0], e.numel() / e.shape[0], it.plan);
  });
  std::cout << out << ": GGUF v3, " << d.arch << ", " << w.tensors() << " tensors ("
            << (merge ? std::to_string(merged) + " with their adapters merged"
                      : std::string("the NF4 base dequantized, no adapters"))
            << "; matrices " << gguf::tensor_type_name(type) << ", vectors f32), step " << c.step
            << "\n"
            << out << ": tokenizer: " << tok.summary << "\n";
  if (!fallbacks.empty())
    std::cout << out << ": note: rows not whole blocks of 32, written as f16 (as llama.cpp's "
              << "converter does): " << fallbacks << "\n";
}

}  // namespace kqlora::exporter
