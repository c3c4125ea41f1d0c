// kqlora-export: a checkpoint's weights for other tools: the merged weights (dequantized
// base + scale * B A) as safetensors, or the adapters in PEFT's layout.

#include <Kokkos_Core.hpp>

#include <sys/stat.h>
#include <cmath>
#include <fstream>
#include <iostream>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "app_main.hpp"
#include "kqlora/core/blas.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace {

const char* usage =
    "usage: kqlora-export CHECKPOINT --merged OUT.safetensors [--dtype float32|bfloat16]\n"
    "       kqlora-export CHECKPOINT --peft DIR\n"
    "\n"
    "CHECKPOINT is a checkpoint file, a step directory or a save_dir (its latest).\n"
    "  --merged FILE   every NF4 weight dequantized, plus (alpha/rank) * B A where a LoRA\n"
    "                  adapter targets it, and the other tensors (biases, frozen dense) as\n"
    "                  they are, as safetensors (names as in the checkpoint)\n"
    "  --dtype T       float32 (default) or bfloat16 (rounded to nearest even)\n"
    "  --peft DIR      DIR/adapter_model.safetensors (base_model.model.<module>.lora_A.weight,\n"
    "                  lora_B.weight, e.g. module layers.0) and DIR/adapter_config.json\n"
    "                  (peft_type LORA)\n"
    "  --version       version and build configuration\n"
    "Exit codes: 0 done, 2 bad input, 1 other failure.\n";

using Host = Kokkos::DefaultHostExecutionSpace;

const kqlora::CheckpointTensor& find_param(const kqlora::CheckpointContents& c,
                                           const std::string& name, const std::string& file) {
  for (const auto& p : c.params)
    if (p.name == name) return p;
  KQLORA_INPUT_CHECK(false, file << ": parameter '" << name << "' is missing");
}

const kqlora::h5::HostNf4& find_nf4(const kqlora::CheckpointContents& c, const std::string& name,
                                    const std::string& file) {
  for (const auto& [n, t] : c.nf4)
    if (n == name) return t;
  KQLORA_INPUT_CHECK(false, file << ": NF4 parameter '" << name << "' is missing");
}

/// The adapter over an entry, or one that an entry is the A or B of.
const kqlora::LoraAdapter* adapter_of(const kqlora::ParamTable& t, const std::string& name) {
  for (const auto& a : t.adapters)
    if (a.base == name || a.a == name || a.b == name) return &a;
  return nullptr;
}

/// Every tensor of the table, group by group (each group's NF4 weights first), as the
/// merged model: an NF4 weight dequantized plus scale * B A where an adapter targets it,
/// the other tensors as they are; adapters' A and B are merged, not written.
void write_merged(const kqlora::CheckpointContents& c, const std::string& file,
                  const std::string& out, bool bf16) {
  const kqlora::ParamTable& table = c.table;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> b16;
  std::vector<kqlora::safetensors::TensorToWrite> tensors;
  f32.reserve(table.entries.size());
  b16.reserve(table.entries.size());
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    if (bf16) {
      b16.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) b16.back()[i] = kqlora::bfloat16(v[i]).bits;
      tensors.push_back({name, "BF16", shape, b16.back().data(), 2 * v.size()});
    } else {
      f32.push_back(std::move(v));
      tensors.push_back({name, "F32", shape, f32.back().data(), 4 * f32.back().size()});
    }
  };
  auto merged = [&](const kqlora::ParamEntry& e) {
    const auto& base = find_nf4(c, e.name, file);
    KQLORA_INPUT_CHECK(base.layout.shape == e.shape,
                       file << ": '" << e.name << "' has shape " << base.layout.shape_string());
    const int64_t out_f = e.shape.at(0), in_f = e.shape.at(1);
    Kokkos::View<float*, Kokkos::HostSpace> w("kqlora::export::w", out_f * in_f);
    kqlora::nf4_dequantize(Host(), base, w);
    const kqlora::LoraAdapter* ad = adapter_of(table, e.name);
    if (ad) {
      const int64_t r = ad->rank;
      const auto& A = find_param(c, ad->a, file);
      const auto& B = find_param(c, ad->b, file);
      KQLORA_INPUT_CHECK(A.data.size() == size_t(r * in_f) && B.data.size() == size_t(out_f * r),
                         file << ": " << ad->module << ": adapters do not match rank " << r);
      // W [out, in] += scale * B [out, r] A [r, in] (all row-major).
      const float scale = static_cast<float>(ad->alpha / static_cast<double>(r));
      kqlora::Matrix<Kokkos::HostSpace> Wm(w.data(), out_f, in_f);
      kqlora::Matrix<Kokkos::HostSpace> Am(const_cast<float*>(A.data.data()), r, in_f);
      kqlora::Matrix<Kokkos::HostSpace> Bm(const_cast<float*>(B.data.data()), out_f, r);
      kqlora::gemm(Host(), "N", "N", scale, Bm, Am, 1.0f, Wm);
    }
    add(e.name, e.shape, std::vector<float>(w.data(), w.data() + w.extent(0)));
  };
  for (int g = 0; g < table.num_groups(); ++g) {
    for (const auto& e : table.entries)
      if (e.group == g && e.kind == kqlora::ParamKind::nf4) merged(e);
    for (const auto& e : table.entries) {
      if (e.group != g || e.kind == kqlora::ParamKind::nf4 || !e.tied_to.empty()) continue;
      const kqlora::LoraAdapter* ad = adapter_of(table, e.name);
      if (ad && (ad->a == e.name || ad->b == e.name)) continue;
      add(e.name, e.shape, find_param(c, e.name, file).data);
    }
  }
  kqlora::safetensors::write(
      out, tensors,
      {{"format", "pt"}, {"producer", "kqlora-export"}, {"step", std::to_string(c.step)}});
  std::cout << out << ": " << tensors.size() << " merged tensors ("
            << (bf16 ? "bfloat16" : "float32") << ", step " << c.step << ")\n";
}

/// The trainable tensors in PEFT's layout: each adapter's A and B as
/// base_model.model.<module>.lora_A/lora_B.weight, the other trainable tensors under
/// base_model.model.<name>.
void write_peft(const kqlora::CheckpointContents& c, const std::string& file,
                const std::string& dir) {
  const kqlora::ParamTable& table = c.table;
  KQLORA_INPUT_CHECK(!table.adapters.empty(), file << ": the model has no LoRA adapters");
  KQLORA_INPUT_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST,
                     dir << ": cannot create: " << std::strerror(errno));
  std::vector<kqlora::safetensors::TensorToWrite> tensors;
  std::ostringstream targets;
  bool other_trainable = false;
  auto add = [&](const std::string& name, const kqlora::CheckpointTensor& t) {
    tensors.push_back(
        {"base_model.model." + name, "F32", t.shape, t.data.data(), 4 * t.data.size()});
  };
  for (int g = 0; g < table.num_groups(); ++g) {
    for (const auto& a : table.adapters) {
      if (table.at(a.base).group != g) continue;
      add(a.module + ".lora_A.weight", find_param(c, a.a, file));
      add(a.module + ".lora_B.weight", find_param(c, a.b, file));
      targets << (targets.tellp() > 0 ? ", " : "") << kqlora::json::quote(a.module);
    }
    for (const auto& e : table.entries) {
      if (e.group != g || e.kind != kqlora::ParamKind::trainable || adapter_of(table, e.name))
        continue;
      add(e.name, find_param(c, e.name, file));
      other_trainable = true;
    }
  }
  const kqlora::LoraAdapter& first = table.adapters.front();
  kqlora::safetensors::write(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  std::ofstream js(dir + "/adapter_config.json");
  js << "{\n"
     << "  \"peft_type\": \"LORA\",\n"
     << "  \"task_type\": null,\n"
     << "  \"base_model_name_or_path\": null,\n"
     << "  \"r\": " << first.rank << ",\n"
     << "  \"lora_alpha\": " << first.alpha << ",\n"
     << "  \"lora_dropout\": " << first.dropout << ",\n"
     << "  \"target_modules\": [" << targets.str() << "],\n"
     << "  \"bias\": \"" << (other_trainable ? "all" : "none") << "\",\n"
     << "  \"fan_in_fan_out\": false,\n"
     << "  \"use_rslora\": false,\n"
     << "  \"init_lora_weights\": true,\n"
     << "  \"inference_mode\": true\n"
     << "}\n";
  KQLORA_INPUT_CHECK(js.good(), dir << "/adapter_config.json: write failed");
  std::cout << dir << ": adapter_model.safetensors (" << tensors.size()
            << " tensors) and adapter_config.json (r " << first.rank << ", alpha " << first.alpha
            << ", step " << c.step << ")\n";
}

int export_main(std::vector<std::string>& args) {
  std::string merged, peft, dtype = "float32";
  const bool has_merged = kqlora::app::take_option(args, "--merged", &merged);
  const bool has_peft = kqlora::app::take_option(args, "--peft", &peft);
  kqlora::app::take_option(args, "--dtype", &dtype);
  for (const auto& a : args)
    KQLORA_INPUT_CHECK(a.empty() || a[0] != '-', "unknown option '" << a << "' (see --help)");
  KQLORA_INPUT_CHECK(args.size() == 1, "expected one CHECKPOINT (see --help)");
  KQLORA_INPUT_CHECK(has_merged != has_peft, "give exactly one of --merged FILE and --peft DIR");
  KQLORA_INPUT_CHECK(dtype == "float32" || dtype == "bfloat16",
                     "--dtype: expected float32 or bfloat16, got '" << dtype << "'");
  const auto files = kqlora::checkpoint_files(args[0]);
  // DDP ranks hold the same parameters (rank 0's file speaks for the run); FSDP shards are
  // reassembled.
  std::vector<kqlora::CheckpointContents> parts;
  for (const auto& f : files) parts.push_back(kqlora::read_checkpoint_file(f));
  const auto c = kqlora::assemble_checkpoint(parts, args[0]);
  if (has_merged)
    write_merged(c, files.front(), merged, dtype == "bfloat16");
  else
    write_peft(c, files.front(), peft);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-export", usage, export_main);
}
