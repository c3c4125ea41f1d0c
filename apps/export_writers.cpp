#include "export_writers.hpp"

#include <Kokkos_Core.hpp>

#include <sys/stat.h>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/blas.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/io/peft_adapter.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/nn/decoder_spec.hpp"
#include "kqlora/nn/model_config.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace kqlora::exporter {

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

const CheckpointTensor& find_param(const CheckpointContents& c, const std::string& name,
                                   const std::string& file) {
  for (const auto& p : c.params)
    if (p.name == name) return p;
  KQLORA_INPUT_CHECK(false, file << ": parameter '" << name << "' is missing");
}

const h5::HostNf4& find_nf4(const CheckpointContents& c, const std::string& name,
                            const std::string& file) {
  for (const auto& [n, t] : c.nf4)
    if (n == name) return t;
  KQLORA_INPUT_CHECK(false, file << ": NF4 parameter '" << name << "' is missing");
}

/// The adapter over an entry, or one that an entry is the A or B of.
const LoraAdapter* adapter_of(const ParamTable& t, const std::string& name) {
  for (const auto& a : t.adapters)
    if (a.base == name || a.a == name || a.b == name) return &a;
  return nullptr;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  KQLORA_CHECK(!f.fail(), path << ": write failed: " << std::strerror(errno));
}

/// Copies `from` to `to` when `from` exists; whether it did.
bool copy_if_there(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in.good()) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  write_text(to, ss.str());
  return true;
}

/// config.json's text with "dtype" (and "torch_dtype", where present) the exported dtype
/// and no quantization_config: the weights written beside it are plain tensors.
std::string exported_config(const std::string& text, const std::string& file, bool bf16) {
  json::Value doc = json::parse(text, file + ": attribute hf_config");
  KQLORA_INPUT_CHECK(doc.kind == json::Value::Kind::object,
                     file << ": attribute hf_config is not a JSON object");
  json::Value dtype;
  dtype.kind = json::Value::Kind::string;
  dtype.string = bf16 ? "bfloat16" : "float32";
  bool has_dtype = false;
  std::vector<std::pair<std::string, json::Value>> kept;
  for (auto& [k, v] : doc.object) {
    if (k == "quantization_config") continue;
    if (k == "dtype" || k == "torch_dtype") {
      v = dtype;
      has_dtype |= k == "dtype";
    }
    kept.emplace_back(k, v);
  }
  if (!has_dtype) kept.emplace_back("dtype", dtype);
  doc.object = std::move(kept);
  return json::write(doc);
}

/// The model's spec when it was imported from a Hugging Face directory (null: not).
std::unique_ptr<DecoderSpec> spec_of(const CheckpointContents& c, const std::string& file) {
  if (c.arch_text.empty()) return nullptr;
  return std::make_unique<DecoderSpec>(parse_decoder_config(c.arch_text, file + ": hf_config"));
}

/// A tensor's or module's name on the model AutoModelForCausalLM builds from the
/// directory: "model.X" under the spec's loaded_prefix (Gemma 4's multimodal model),
/// others as they are.
std::string loaded_name(const DecoderSpec* spec, const std::string& name) {
  if (!spec || spec->loaded_prefix.empty() || name.rfind("model.", 0) != 0) return name;
  return spec->loaded_prefix + name.substr(6);
}

/// The directory's tensors under the prefixes the spec skipped (Gemma 4's vision and
/// audio towers), as they are, into `tensors` (their bytes kept in `bytes`): a merged
/// export loads as the whole multimodal model.
void add_skipped_tensors(const DecoderSpec& spec, const std::string& dir,
                         std::list<std::vector<uint8_t>>& bytes,
                         std::vector<safetensors::TensorToWrite>& tensors) {
  // (only where the model loaded from the directory is the multimodal one: Qwen3.5's is
  // its text decoder, which the towers would not fit)
  if (spec.skipped.empty() || spec.loaded_prefix.empty()) return;
  if (dir.empty() || (!std::ifstream(dir + "/model.safetensors").good() &&
                      !std::ifstream(dir + "/model.safetensors.index.json").good())) {
    std::cout << "note: hf_model_dir '" << dir
              << "' has no weights file: the towers the model loads beside its text decoder "
                 "are not copied (transformers initialises them at random)\n";
    return;
  }
  std::vector<std::string> files;
  const std::string single = dir + "/model.safetensors", index = single + ".index.json";
  if (std::ifstream(single).good())
    files.push_back(single);
  else
    files = safetensors::index_shards(index);
  for (const std::string& path : files) {
    const safetensors::Header h = safetensors::read_header(path);
    for (const auto& t : h.tensors) {
      bool skipped = false;
      for (const auto& [prefix, why] : spec.skipped) skipped |= t.name.rfind(prefix, 0) == 0;
      if (!skipped) continue;
      bytes.push_back(safetensors::read_bytes(h, t));
      tensors.push_back({t.name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
    }
  }
}

}  // namespace

std::string hf_model_dir(const CheckpointContents& c, const std::string& file) {
  return ModelConfig::from_text(c.model_config_text, file).hf_model_dir;
}

std::vector<float> weight_values(const CheckpointContents& c, const ParamEntry& e,
                                 const std::string& file, bool merge, bool* merged) {
  const ParamTable& table = c.table;
  const auto& base = find_nf4(c, e.name, file);
  KQLORA_INPUT_CHECK(base.layout.shape == e.shape,
                     file << ": '" << e.name << "' has shape " << base.layout.shape_string());
  const int64_t out_f = e.shape.at(0), in_f = e.shape.at(1);
  Kokkos::View<float*, Kokkos::HostSpace> w("kqlora::export::w", out_f * in_f);
  nf4_dequantize(Host(), base, w);
  const LoraAdapter* ad = merge ? adapter_of(table, e.name) : nullptr;
  if (merged) *merged = ad != nullptr;
  if (ad) {
    const int64_t r = ad->rank;
    const auto& A = find_param(c, ad->a, file);
    const auto& B = find_param(c, ad->b, file);
    KQLORA_INPUT_CHECK(A.data.size() == size_t(r * in_f) && B.data.size() == size_t(out_f * r),
                       file << ": " << ad->module << ": adapters do not match rank " << r);
    // W [out, in] += scale * B [out, r] A [r, in] (all row-major).
    const float scale = static_cast<float>(ad->alpha / static_cast<double>(r));
    Matrix<Kokkos::HostSpace> Wm(w.data(), out_f, in_f);
    Matrix<Kokkos::HostSpace> Am(const_cast<float*>(A.data.data()), r, in_f);
    Matrix<Kokkos::HostSpace> Bm(const_cast<float*>(B.data.data()), out_f, r);
    gemm(Host(), "N", "N", scale, Bm, Am, 1.0f, Wm);
  }
  int64_t at = -1;
  const ExpertAdapter* xa = merge && !ad ? table.expert_adapter_of(e.name, &at) : nullptr;
  if (xa && at >= 0) {  // expert j's part k: its A rows and the part's rows of its B
    if (merged) *merged = true;
    const int64_t r = xa->rank, j = at / xa->parts(), k = at % xa->parts();
    const auto& A = find_param(c, xa->a, file);
    const auto& B = find_param(c, xa->b, file);
    KQLORA_INPUT_CHECK(
        A.data.size() == size_t(xa->experts * r * in_f) &&
            B.data.size() == size_t(xa->experts * xa->out * r) && out_f * xa->parts() == xa->out,
        file << ": " << xa->module << "." << xa->parameter << ": adapters do not match rank " << r);
    const float scale = static_cast<float>(xa->alpha / static_cast<double>(r));
    Matrix<Kokkos::HostSpace> Wm(w.data(), out_f, in_f);
    Matrix<Kokkos::HostSpace> Am(const_cast<float*>(A.data.data()) + j * r * in_f, r, in_f);
    Matrix<Kokkos::HostSpace> Bm(const_cast<float*>(B.data.data()) + (j * xa->out + k * out_f) * r,
                                 out_f, r);
    gemm(Host(), "N", "N", scale, Bm, Am, 1.0f, Wm);
  }
  return std::vector<float>(w.data(), w.data() + w.extent(0));
}

const std::vector<float>& dense_values(const CheckpointContents& c, const std::string& name,
                                       const std::string& file) {
  return find_param(c, name, file).data;
}

bool is_adapter_tensor(const CheckpointContents& c, const std::string& name) {
  const LoraAdapter* ad = adapter_of(c.table, name);
  const ExpertAdapter* xa = c.table.expert_adapter_of(name);
  return (ad && (ad->a == name || ad->b == name)) || (xa && (xa->a == name || xa->b == name));
}

void write_weights(const CheckpointContents& c, const std::string& file, const std::string& out,
                   bool bf16, bool merge, const std::string& shown) {
  const ParamTable& table = c.table;
  const std::unique_ptr<DecoderSpec> spec = spec_of(c, file);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> b16;
  std::vector<safetensors::TensorToWrite> tensors;
  f32.reserve(table.entries.size());
  b16.reserve(table.entries.size());
  auto add = [&](const std::string& stored, std::vector<int64_t> shape, std::vector<float> v) {
    const std::string name = loaded_name(spec.get(), stored);
    if (bf16) {
      b16.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) b16.back()[i] = bfloat16(v[i]).bits;
      tensors.push_back({name, "BF16", shape, b16.back().data(), 2 * v.size()});
    } else {
      f32.push_back(std::move(v));
      tensors.push_back({name, "F32", shape, f32.back().data(), 4 * f32.back().size()});
    }
  };
  int merged = 0;
  // Entries with a place in a fused tensor (ParamEntry::alts, the first: an expert's slice
  // of transformers 5's gate_up_proj or down_proj, gpt-oss's interleaved ones, its router's
  // name) are written there, in the layout transformers 5 loads; a fused tensor is written
  // once its group is done.
  std::vector<std::pair<std::string, std::vector<int64_t>>> fused_order;
  std::map<std::string, std::vector<float>> fused;
  auto place = [&](const ParamEntry& e, const std::vector<float>& v) {
    const TensorSlice& a = e.alts.front();
    auto it = fused.find(a.tensor);
    if (it == fused.end()) {
      int64_t n = 1;
      for (int64_t d : a.shape) n *= d;
      it = fused.emplace(a.tensor, std::vector<float>(static_cast<size_t>(n))).first;
      fused_order.emplace_back(a.tensor, a.shape);
    }
    const int64_t rows = e.shape.size() == 2 ? e.shape[0] : 1, cols = e.shape.back();
    const int64_t row_stride = a.row_stride ? a.row_stride : cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k)
        it->second[static_cast<size_t>(a.first + r * row_stride + k * a.col_stride)] =
            v[static_cast<size_t>(r * cols + k)];
  };
  auto weight = [&](const ParamEntry& e) {
    bool with_adapter = false;
    std::vector<float> v = weight_values(c, e, file, merge, &with_adapter);
    merged += with_adapter;
    if (e.alts.empty())
      add(e.name, e.shape, std::move(v));
    else
      place(e, v);
  };
  for (int g = 0; g < table.num_groups(); ++g) {
    for (const auto& e : table.entries)
      if (e.group == g && e.kind == ParamKind::nf4) weight(e);
    for (const auto& e : table.entries) {
      if (e.group != g || e.kind == ParamKind::nf4 || !e.tied_to.empty()) continue;
      if (is_adapter_tensor(c, e.name)) continue;
      if (e.alts.empty())
        add(e.name, e.shape, dense_values(c, e.name, file));
      else
        place(e, dense_values(c, e.name, file));
    }
    for (auto& [name, shape] : fused_order) add(name, shape, std::move(fused[name]));
    fused_order.clear();
    fused.clear();
  }
  std::list<std::vector<uint8_t>> copied;  // (a list: stable addresses)
  if (spec) add_skipped_tensors(*spec, hf_model_dir(c, file), copied, tensors);
  safetensors::write(
      out, tensors,
      {{"format", "pt"}, {"producer", "kqlora-export"}, {"step", std::to_string(c.step)}});
  std::cout << (shown.empty() ? out : shown) << ": " << tensors.size() << " tensors ("
            << (merge ? std::to_string(merged) + " with their adapters merged"
                      : std::string("the NF4 base dequantized, no adapters"))
            << ", " << (bf16 ? "bfloat16" : "float32") << ", step " << c.step
            << (copied.empty() ? std::string()
                               : ", " + std::to_string(copied.size()) +
                                     " of hf_model_dir's untrained towers as they are")
            << ")\n";
}

/// The tokenizer and generation files a Hugging Face directory export copies.
constexpr const char* kCopiedFiles[] = {
    "generation_config.json",  "tokenizer.json",      "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
    "tokenizer.model",         "vocab.json",          "merges.txt",
    "added_tokens.json"};

bool hf_directory_entry(const std::string& name) {
  if (name == "model.safetensors" || name == "config.json") return true;
  for (const char* n : kCopiedFiles)
    if (name == n) return true;
  return false;
}

bool peft_directory_entry(const std::string& name) {
  return name == "adapter_model.safetensors" || name == "adapter_config.json";
}

void write_hf_directory(const CheckpointContents& c, const std::string& file,
                        const std::string& dir, const std::string& shown, bool bf16, bool merge) {
  KQLORA_INPUT_CHECK(!c.arch_text.empty(),
                     file << ": not a model imported from a Hugging Face directory (no "
                             "hf_config attribute): --merged and --base write a safetensors "
                             "file for it");
  write_weights(c, file, dir + "/model.safetensors", bf16, merge, shown + "/model.safetensors");
  write_text(dir + "/config.json", exported_config(c.arch_text, file, bf16));
  const std::string src = hf_model_dir(c, file);
  std::vector<std::string> copied;
  for (const char* name : kCopiedFiles)
    if (!src.empty() && copy_if_there(src + "/" + name, dir + "/" + name)) copied.push_back(name);
  std::cout << shown << "/config.json: the checkpoint's config.json (dtype "
            << (bf16 ? "bfloat16" : "float32") << ")\n";
  if (copied.empty()) {
    std::cout << shown << ": note: no tokenizer or generation files copied (hf_model_dir '" << src
              << "' has none here); copy them from the model's directory\n";
  } else {
    std::cout << shown << ": from " << src << ":";
    for (const auto& n : copied) std::cout << " " << n;
    std::cout << "\n";
  }
}

void write_peft(const CheckpointContents& c, const std::string& file, const std::string& dir,
                const std::string& shown) {
  const ParamTable& table = c.table;
  KQLORA_INPUT_CHECK(!table.adapters.empty() || !table.expert_adapters.empty(),
                     file << ": the model has no LoRA adapters");
  const bool hf = !c.arch_text.empty();
  const std::unique_ptr<DecoderSpec> loaded = spec_of(c, file);
  if (hf) {
    // PEFT (0.21, on transformers 5) reads a target named as an expert's v4 projection
    // (gate_proj, up_proj, down_proj; Mixtral's w1, w3, w2) as the experts' fused
    // parameter, with twice the rank on gate_up: an adapter on a dense MLP (or a shared
    // expert) of that name cannot be loaded as itself beside the experts.
    const DecoderSpec& spec = *loaded;
    if (spec.any_sparse_mlp())
      for (const auto& a : table.adapters) {
        const std::string leaf = a.module.substr(a.module.rfind('.') + 1);
        const ExpertsSpec& x = spec.experts;
        KQLORA_INPUT_CHECK(
            leaf != x.gate_name && leaf != x.up_name && leaf != x.down_name,
            file << ": --peft: the adapter on " << a.module
                 << " has the name of the experts' projections, which PEFT (on transformers "
                    "5) maps onto the experts' fused parameters: a PEFT adapter cannot hold it "
                    "(docs/MODELS.md, \"Experts\"); export --merged, or train with lora_targets "
                    "that leave out the dense MLP's "
                 << leaf);
      }
  }
  std::vector<safetensors::TensorToWrite> tensors;
  std::vector<std::string> targets;
  std::set<std::string> seen, parameters;   // (PEFT sorts target_parameters; so does a set)
  std::list<std::vector<float>> converted;  // (B in PEFT's layout; a list: stable addresses)
  bool other_trainable = false;
  auto add = [&](const std::string& key, const CheckpointTensor& t) {
    tensors.push_back({key, "F32", t.shape, t.data.data(), 4 * t.data.size()});
  };
  for (int g = 0; g < table.num_groups(); ++g) {
    for (const auto& a : table.adapters) {
      if (table.at(a.base).group != g) continue;
      const std::string module = loaded_name(loaded.get(), a.module);
      add(peft::adapter_key(module, false), find_param(c, a.a, file));
      add(peft::adapter_key(module, true), find_param(c, a.b, file));
      // Hugging Face models: the projection names (PEFT matches a module whose name ends
      // in one); every block has the same adapters.
      const std::string t = hf ? a.module.substr(a.module.rfind('.') + 1) : a.module;
      if (seen.insert(t).second) targets.push_back(t);
    }
    for (const auto& a : table.expert_adapters) {  // (target_parameters)
      if (table.at(a.a).group != g) continue;
      const std::string module = loaded_name(loaded.get(), a.module);
      add(peft::expert_adapter_key(a, false, module), find_param(c, a.a, file));
      converted.push_back(peft::convert_expert_b(a, find_param(c, a.b, file).data, true));
      tensors.push_back({peft::expert_adapter_key(a, true, module), "F32",
                         peft::peft_expert_b_shape(a), converted.back().data(),
                         4 * converted.back().size()});
      parameters.insert(a.target);
    }
    for (const auto& e : table.entries) {
      if (e.group != g || e.kind != ParamKind::trainable || is_adapter_tensor(c, e.name)) continue;
      add(peft::tensor_key(loaded_name(loaded.get(), e.name)), find_param(c, e.name, file));
      other_trainable = true;
    }
  }
  const double alpha =
      table.adapters.empty() ? table.expert_adapters.front().alpha : table.adapters.front().alpha;
  const int64_t rank =
      table.adapters.empty() ? table.expert_adapters.front().rank : table.adapters.front().rank;
  const double dropout = table.adapters.empty() ? 0.0 : table.adapters.front().dropout;
  // (producer: what tells an earlier export from another directory, docs/RELIABILITY.md)
  safetensors::write(
      dir + "/adapter_model.safetensors", tensors,
      {{"format", "pt"}, {"producer", "kqlora-export"}, {"step", std::to_string(c.step)}});
  std::string base = "null";
  if (hf) {
    const std::string src = hf_model_dir(c, file);
    char resolved[PATH_MAX];
    base = json::quote(::realpath(src.c_str(), resolved) ? std::string(resolved) : src);
  }
  std::ostringstream js;
  js << "{\n"
     << "  \"peft_type\": \"LORA\",\n"
     << "  \"task_type\": " << (hf ? "\"CAUSAL_LM\"" : "null") << ",\n"
     << "  \"base_model_name_or_path\": " << base << ",\n"
     << "  \"r\": " << rank << ",\n"
     << "  \"lora_alpha\": " << alpha << ",\n"
     << "  \"lora_dropout\": " << dropout << ",\n"
     << "  \"target_modules\": ";
  if (loaded && !loaded->loaded_prefix.empty()) {
    // A multimodal model (Gemma 4's): a regular expression PEFT matches whole, the text
    // decoder's projections alone (the towers have Linear modules of the same names).
    std::string re;
    for (char ch : loaded->loaded_prefix) re += ch == '.' ? std::string("\\.") : std::string(1, ch);
    re += ".*\\.(";
    for (size_t i = 0; i < targets.size(); ++i) re += (i ? "|" : "") + targets[i];
    js << json::quote(re + ")") << ",\n";
  } else {
    js << "[";
    for (size_t i = 0; i < targets.size(); ++i) js << (i ? ", " : "") << json::quote(targets[i]);
    js << "],\n";
  }
  if (!parameters.empty()) {
    js << "  \"target_parameters\": [";
    for (auto it = parameters.begin(); it != parameters.end(); ++it)
      js << (it == parameters.begin() ? "" : ", ") << json::quote(*it);
    js << "],\n";
  }
  js << "  \"bias\": \"" << (other_trainable ? "all" : "none") << "\",\n"
     << "  \"fan_in_fan_out\": false,\n"
     << "  \"use_rslora\": false,\n"
     << "  \"init_lora_weights\": true,\n"
     << "  \"inference_mode\": true\n"
     << "}\n";
  write_text(dir + "/adapter_config.json", js.str());
  std::cout << shown << ": adapter_model.safetensors (" << tensors.size()
            << " tensors) and adapter_config.json (r " << rank << ", alpha " << alpha
            << (hf ? ", task_type CAUSAL_LM" : "") << ", step " << c.step << ")\n";
}

}  // namespace kqlora::exporter
