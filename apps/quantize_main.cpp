// kqlora-quantize: float weights (safetensors, sharded safetensors, HDF5) to NF4 groups in
// the checkpoint schema's /params, usable as a training run's init_file.

#include <Kokkos_Core.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "app_main.hpp"
#include "kqlora/core/atomic_output.hpp"
#include "kqlora/core/build_info.hpp"
#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/non_finite.hpp"
#include "kqlora/core/output_guard.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/io/tensor_source.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

namespace {

const char* usage =
    "usage: kqlora-quantize IN OUT.h5 [--config CONFIG.json] [--block-size 64]\n"
    "                       [--scaler-block-size 256]\n"
    "\n"
    "Quantizes every 2-D float tensor of IN to NF4 (double-quantized scalers, torchao's\n"
    "bytes) and writes OUT.h5 with /params/<name> in kqlora's checkpoint schema, usable as\n"
    "init_file. IN is a .safetensors file (F32, BF16, F16), a sharded checkpoint's\n"
    "model.safetensors.index.json, or an HDF5 file of float datasets. Tensors that cannot\n"
    "be quantized (empty, 1-D, numel not a multiple of the block size) are copied as float\n"
    "datasets, with a note. BF16 tensors give bfloat16 NF4; F32 and F16 give float32 NF4.\n"
    "Prints the relative Frobenius error of each dequantized weight.\n"
    "\n"
    "  --config CONFIG.json    a decoder's config.json (model = causal_lm): quantize the\n"
    "                          tensors it holds in NF4 (projections, experts), copy those it\n"
    "                          holds dense (embedding, head, norms, biases, routers) as\n"
    "                          floats, skip the others with a note -- an init_file that\n"
    "                          gives the model every base tensor (hf_model_dir may then hold\n"
    "                          config.json alone; docs/TRAINING.md)\n"
    "  --block-size N          elements per absmax block (even; default 64)\n"
    "  --scaler-block-size N   block scalers per double-quantization block (default 256)\n"
    "  --version               version and build configuration\n"
    "Exit codes: 0 done, 2 bad input (nothing written), 1 other failure.\n";

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

template <class T>
kqlora::h5::HostNf4 quantize(const std::vector<T>& values, const kqlora::Nf4Layout& layout,
                             const std::string& name, double* rel_error) {
  Exec exec;
  Kokkos::View<T*, Mem> in(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::quantize::in"),
                           values.size());
  // device-wide: kqlora-quantize has no training step
  Kokkos::deep_copy(in, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                            values.data(), values.size()));
  auto nf4 = kqlora::nf4_quantize<T>(exec, Kokkos::View<const T*, Mem>(in), layout, name);
  Kokkos::View<float*, Mem> out(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::quantize::dequantized"),
      values.size());
  kqlora::nf4_dequantize(exec, nf4, out);
  // device-wide: as above
  auto out_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = static_cast<float>(values[i]);
    num += (out_h(i) - x) * (out_h(i) - x);
    den += x * x;
  }
  *rel_error = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return kqlora::nf4_copy_to<Kokkos::HostSpace>(nf4);
}

int quantize_main(std::vector<std::string>& args) {
  kqlora::Nf4Layout defaults;
  std::string v;
  if (kqlora::app::take_option(args, "--block-size", &v))
    defaults.block_size = kqlora::parse_integer(v, "--block-size");
  if (kqlora::app::take_option(args, "--scaler-block-size", &v))
    defaults.scaler_block_size = kqlora::parse_integer(v, "--scaler-block-size");
  std::string config_path;
  kqlora::app::take_option(args, "--config", &config_path);
  for (const auto& a : args)
    KQLORA_INPUT_CHECK(a.empty() || a[0] != '-' || a == "-",
                       "unknown option '" << a << "' (see --help)");
  KQLORA_INPUT_CHECK(args.size() == 2,
                     "expected IN and OUT.h5, got " << args.size() << " arguments (see --help)");
  KQLORA_INPUT_CHECK(defaults.block_size > 0 && defaults.block_size % 2 == 0,
                     "--block-size must be a positive even number, got " << defaults.block_size);
  KQLORA_INPUT_CHECK(defaults.scaler_block_size > 0,
                     "--scaler-block-size must be positive, got " << defaults.scaler_block_size);
  const std::string in_path = args[0], out_path = args[1];
  // --config: the decoder's table says which tensors are NF4 and which dense.
  kqlora::ParamTable table;
  if (!config_path.empty()) {
    std::ifstream f(config_path);
    KQLORA_INPUT_CHECK(f.good(), config_path << ": cannot read: " << std::strerror(errno));
    std::ostringstream text;
    text << f.rdbuf();
    kqlora::ModelConfig mc;
    mc.kind = "causal_lm";
    mc.arch_text = text.str();
    mc.arch_source = config_path;
    mc.rank = 1;  // (adapters do not matter here)
    mc.block_size = defaults.block_size;
    mc.scaler_block_size = defaults.scaler_block_size;
    table = kqlora::model_kind("causal_lm").table(mc);
  }
  // OUT never destroys IN (docs/RELIABILITY.md, "Writers"); checked before any work.
  // (its headers only: the shards of an index are inputs too)
  auto source = kqlora::open_tensor_source(in_path);
  std::vector<kqlora::WriterInput> inputs{{in_path, "the input"}};
  for (const auto& file : source->files()) inputs.push_back({file, "the input's file"});
  kqlora::refuse_output_over_inputs("OUT.h5", out_path, inputs);
  kqlora::check_file_output("OUT.h5", out_path);

  // Written under a temporary name and renamed at the end: a failure leaves no half file
  // and an earlier OUT.h5 as it was.
  kqlora::FileOutput output(out_path);
  int quantized = 0, copied = 0, skipped = 0;
  {
    auto file = kqlora::h5::create_file(output.temp());
    {
      kqlora::h5::write_attribute(file, "format", std::string("kqlora-params"));
      kqlora::h5::write_attribute(file, "format_version", int64_t(2));
      kqlora::h5::write_attribute(file, "kqlora_version", kqlora::version());
      kqlora::h5::write_attribute(file, "created_by", std::string("kqlora-quantize"));
      auto params = kqlora::h5::create_group(file, "params");
      std::cout << std::left << std::setw(48) << "tensor" << std::setw(16) << "shape"
                << std::setw(7) << "dtype"
                << "result\n";
      for (const auto& e : source->entries()) {
        std::ostringstream shape;
        for (size_t i = 0; i < e.shape.size(); ++i) shape << (i ? "x" : "") << e.shape[i];
        std::cout << std::left << std::setw(48) << e.name << std::setw(16) << shape.str()
                  << std::setw(7) << e.dtype;
        if (!e.is_float()) {
          std::cout << "skipped: not a float tensor\n";
          ++skipped;
          continue;
        }
        kqlora::Nf4Layout layout = defaults;
        layout.shape = e.shape;
        const int64_t numel = kqlora::checked_numel(e.shape, in_path + ": tensor '" + e.name + "'");
        std::string why;
        const kqlora::ParamEntry* entry = table.find(e.name);
        if (!config_path.empty() && (!entry || entry->kind == kqlora::ParamKind::trainable)) {
          std::cout << "skipped: not a base tensor of " << config_path << "\n";
          ++skipped;
          continue;
        }
        if (entry && entry->kind == kqlora::ParamKind::dense)
          why = "dense in the model";
        else if (numel == 0)
          why = "empty";
        else if (e.shape.size() != 2)
          why = "1-D or >2-D";
        else if (numel % layout.block_size != 0)
          why = "numel not a multiple of the block size";
        const kqlora::HostTensor t = source->load(e.name);
        if (!why.empty()) {
          // (a copied tensor is looked at too: an init_file must hold finite weights)
          std::vector<float> wide(t.bf16.begin(), t.bf16.end());
          const std::vector<float>& values = t.is_bf16 ? wide : t.f32;
          kqlora::refuse_non_finite(values.data(), static_cast<int64_t>(values.size()), 0, t.shape,
                                    in_path + ": tensor '" + e.name + "'");
          if (t.is_bf16)
            kqlora::h5::write_bfloat16(params, e.name, t.shape, t.bf16.data());
          else
            kqlora::h5::write_float(params, e.name, t.shape, t.f32.data());
          std::cout << "copied as float (" << why << ")\n";
          ++copied;
          continue;
        }
        double err = 0.0;
        const auto nf4 = t.is_bf16 ? quantize(t.bf16, layout, e.name, &err)
                                   : quantize(t.f32, layout, e.name, &err);
        kqlora::h5::write_nf4(params, e.name, nf4);
        std::cout << "NF4 " << kqlora::dtype_name(nf4.layout.dtype) << ", rel. Frobenius error "
                  << std::setprecision(4) << std::scientific << err << std::defaultfloat << "\n";
        ++quantized;
      }
      file.close();
    }
  }
  output.commit();
  std::cout << out_path << ": " << quantized << " quantized, " << copied << " copied, " << skipped
            << " skipped\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "kqlora-quantize", usage, quantize_main);
}
