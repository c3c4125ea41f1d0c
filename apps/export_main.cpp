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
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/deck.hpp"
#include "kqlora/io/json.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace {

const char* usage =
    "usage: kqlora-export CHECKPOINT --merged OUT.safetensors [--dtype float32|bfloat16]\n"
    "       kqlora-export CHECKPOINT --peft DIR\n"
    "\n"
    "CHECKPOINT is a checkpoint file, a step directory or a save_dir (its latest).\n"
    "  --merged FILE   layers.<i>.weight = dequantized NF4 base + (alpha/rank) * B A, and\n"
    "                  layers.<i>.bias when the model has one, as safetensors\n"
    "  --dtype T       float32 (default) or bfloat16 (rounded to nearest even)\n"
    "  --peft DIR      DIR/adapter_model.safetensors (base_model.model.layers.<i>.lora_A.weight,\n"
    "                  lora_B.weight) and DIR/adapter_config.json (peft_type LORA)\n"
    "  --version       version and build configuration\n"
    "Exit codes: 0 done, 2 bad input, 1 other failure.\n";

using Host = Kokkos::DefaultHostExecutionSpace;

const kqlora::CheckpointTensor& find_param(const kqlora::CheckpointContents& c,
                                           const std::string& name, const std::string& file) {
  for (const auto& p : c.params)
    if (p.name == name) return p;
  KQLORA_INPUT_CHECK(false, file << ": parameter '" << name << "' is missing");
}

void write_merged(const kqlora::CheckpointContents& c, const kqlora::Config& cfg,
                  const std::string& file, const std::string& out, bool bf16) {
  const int64_t d = cfg.dim, r = cfg.lora_rank;
  const float scale = static_cast<float>(cfg.lora_alpha / cfg.lora_rank);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> b16;
  std::vector<kqlora::safetensors::TensorToWrite> tensors;
  f32.reserve(2 * cfg.num_linears);
  b16.reserve(2 * cfg.num_linears);
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
  for (int l = 0; l < cfg.num_linears; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const kqlora::h5::HostNf4* base = nullptr;
    for (const auto& [n, t] : c.nf4)
      if (n == p + "weight") base = &t;
    KQLORA_INPUT_CHECK(base, file << ": NF4 parameter '" << p << "weight' is missing");
    KQLORA_INPUT_CHECK(base->layout.shape == (std::vector<int64_t>{d, d}),
                       file << ": '" << p << "weight' has shape " << base->layout.shape_string());
    Kokkos::View<float*, Kokkos::HostSpace> w("kqlora::export::w", d * d);
    kqlora::nf4_dequantize(Host(), *base, w);
    const auto& A = find_param(c, p + "lora_a.weight", file);
    const auto& B = find_param(c, p + "lora_b.weight", file);
    KQLORA_INPUT_CHECK(A.data.size() == size_t(r * d) && B.data.size() == size_t(d * r),
                       file << ": layer " << l << ": adapters do not match rank " << r);
    // W [d, d] += scale * B [d, r] A [r, d] (all row-major).
    kqlora::Matrix<Kokkos::HostSpace> Wm(w.data(), d, d);
    kqlora::Matrix<Kokkos::HostSpace> Am(const_cast<float*>(A.data.data()), r, d);
    kqlora::Matrix<Kokkos::HostSpace> Bm(const_cast<float*>(B.data.data()), d, r);
    kqlora::gemm(Host(), "N", "N", scale, Bm, Am, 1.0f, Wm);
    add(p + "weight", {d, d}, std::vector<float>(w.data(), w.data() + d * d));
    if (cfg.bias) add(p + "bias", {d}, find_param(c, p + "bias", file).data);
  }
  kqlora::safetensors::write(
      out, tensors,
      {{"format", "pt"}, {"producer", "kqlora-export"}, {"step", std::to_string(c.step)}});
  std::cout << out << ": " << tensors.size() << " merged tensors ("
            << (bf16 ? "bfloat16" : "float32") << ", step " << c.step << ")\n";
}

void write_peft(const kqlora::CheckpointContents& c, const kqlora::Config& cfg,
                const std::string& file, const std::string& dir) {
  KQLORA_INPUT_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST,
                     dir << ": cannot create: " << std::strerror(errno));
  std::vector<kqlora::safetensors::TensorToWrite> tensors;
  std::ostringstream targets;
  for (int l = 0; l < cfg.num_linears; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const auto& A = find_param(c, p + "lora_a.weight", file);
    const auto& B = find_param(c, p + "lora_b.weight", file);
    tensors.push_back({"base_model.model." + p + "lora_A.weight", "F32", A.shape, A.data.data(),
                       4 * A.data.size()});
    tensors.push_back({"base_model.model." + p + "lora_B.weight", "F32", B.shape, B.data.data(),
                       4 * B.data.size()});
    if (cfg.bias) {
      const auto& b = find_param(c, p + "bias", file);
      tensors.push_back(
          {"base_model.model." + p + "bias", "F32", b.shape, b.data.data(), 4 * b.data.size()});
    }
    targets << (l ? ", " : "") << kqlora::json::quote("layers." + std::to_string(l));
  }
  kqlora::safetensors::write(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  std::ofstream js(dir + "/adapter_config.json");
  js << "{\n"
     << "  \"peft_type\": \"LORA\",\n"
     << "  \"task_type\": null,\n"
     << "  \"base_model_name_or_path\": null,\n"
     << "  \"r\": " << cfg.lora_rank << ",\n"
     << "  \"lora_alpha\": " << cfg.lora_alpha << ",\n"
     << "  \"lora_dropout\": " << cfg.lora_dropout << ",\n"
     << "  \"target_modules\": [" << targets.str() << "],\n"
     << "  \"bias\": \"" << (cfg.bias ? "all" : "none") << "\",\n"
     << "  \"fan_in_fan_out\": false,\n"
     << "  \"use_rslora\": false,\n"
     << "  \"init_lora_weights\": true,\n"
     << "  \"inference_mode\": true\n"
     << "}\n";
  KQLORA_INPUT_CHECK(js.good(), dir << "/adapter_config.json: write failed");
  std::cout << dir << ": adapter_model.safetensors (" << tensors.size()
            << " tensors) and adapter_config.json (r " << cfg.lora_rank << ", alpha "
            << cfg.lora_alpha << ", step " << c.step << ")\n";
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
  const auto cfg =
      kqlora::parse_deck_text(c.config_text, files.front() + " (config)", {}, 1, false);
  if (has_merged)
    write_merged(c, cfg, files.front(), merged, dtype == "bfloat16");
  else
    write_peft(c, cfg, files.front(), peft);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-export", usage, export_main);
}
