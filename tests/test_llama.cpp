// The Llama model (nn/llama.hpp) against transformers + PEFT + torchao (float32, CPU):
// tests/data/llama_reference, written once by tools/gen_llama_reference.py. Each case is a
// random-initialised Hugging Face model directory; both sides use the NF4 dequantization
// of its projections (init.h5 holds torchao's NF4 components, which take precedence over
// model.safetensors; the dense tensors come from the model directory). Tolerances per
// tensor: max |diff| <= tol * max |ref|.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/nn/llama.hpp"
#include "kqlora/train/init.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
const std::string ref_root = std::string(KQLORA_TEST_DATA_DIR) + "/llama_reference/";

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string name, dir, targets;
};
const std::vector<Case> kCases = {
    {"gqa", ref_root + "gqa", "all-linear"},
    {"tied_head_dim", ref_root + "tied_head_dim", "all-linear"},
    {"llama3_qv", ref_root + "llama3_qv", "q_proj,v_proj"},
    {"mistral", ref_root + "mistral", "all-linear"},
};

kqlora::ModelConfig config_of(const Case& c, kqlora::DType dtype = kqlora::DType::float32) {
  kqlora::ModelConfig m;
  m.kind = "llama";
  m.hf_model_dir = c.dir;
  m.arch_text = read_text(c.dir + "/config.json");
  m.arch_source = c.dir + "/config.json";
  m.lora_targets = c.targets;
  m.rank = 4;
  m.alpha = 8;
  m.block_size = 32;
  m.scaler_block_size = 32;
  m.dtype = dtype;
  m.loss = kqlora::LossKind::cross_entropy;
  m.lora_b_zeros = true;
  return m;
}

std::vector<double> read_doubles(hid_t f, const std::string& name) {
  const auto d = kqlora::h5::dataset_dims(f, name, name);
  int64_t n = 1;
  for (auto x : d) n *= x;
  std::vector<double> v(static_cast<size_t>(n));
  kqlora::h5::read_dataset(f, name, H5T_NATIVE_DOUBLE, n, v.data(), name);
  return v;
}

struct Data {
  kqlora::Batch<Mem> batch;
  std::vector<int32_t> labels;
  int64_t n = 0, S = 0;
  double count = 0;  // scored tokens
};

Data read_data(const std::string& dir) {
  auto f = kqlora::h5::open_file(dir + "/data.h5");
  const auto d = kqlora::h5::dataset_dims(f, "input_ids", dir);
  Data out;
  out.n = d[0];
  out.S = d[1];
  std::vector<int32_t> ids(static_cast<size_t>(out.n * out.S));
  out.labels.resize(ids.size());
  kqlora::h5::read_dataset(f, "input_ids", H5T_NATIVE_INT32, out.n * out.S, ids.data(), dir);
  kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, out.n * out.S, out.labels.data(), dir);
  out.batch.tokens = kqlora::TokenMatrix<Mem>("ids", out.n, out.S);
  out.batch.labels = kqlora::TokenMatrix<Mem>("labels", out.n, out.S);
  auto ht = Kokkos::create_mirror_view(out.batch.tokens);
  auto hl = Kokkos::create_mirror_view(out.batch.labels);
  for (int64_t i = 0; i < out.n; ++i)
    for (int64_t t = 0; t < out.S; ++t) {
      ht(i, t) = ids[i * out.S + t];
      hl(i, t) = out.labels[i * out.S + t];
      if (t > 0 && hl(i, t) != kqlora::kIgnoreLabel) out.count += 1;
    }
  Kokkos::deep_copy(out.batch.tokens, ht);
  Kokkos::deep_copy(out.batch.labels, hl);
  out.batch.global_bs = out.n;
  return out;
}

std::unique_ptr<kqlora::Llama<Exec>> load(const Case& c,
                                          kqlora::DType dtype = kqlora::DType::float32) {
  auto model = std::make_unique<kqlora::Llama<Exec>>(Exec(), config_of(c, dtype));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), *model, c.dir + "/init.h5", log);
  return model;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

class LlamaReference : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaReference, LogitsLossAndLoraGradientsMatchTransformersPeft) {
  const Case& c = GetParam();
  auto model = load(c);
  Data data = read_data(c.dir);
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");

  // Logits at non-padded positions.
  const auto logits =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model->logits(data.batch));
  const auto ref_logits = read_doubles(ref, "logits");
  const auto valid = read_doubles(ref, "valid");
  const int64_t V = model->arch().vocab;
  double worst = 0;
  std::vector<double> valid_ref;
  for (int64_t t = 0; t < data.n * data.S; ++t) {
    if (valid[t] == 0) continue;
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, std::fabs(logits(t, v) - ref_logits[t * V + v]));
      valid_ref.push_back(ref_logits[t * V + v]);
    }
  }
  EXPECT_LE(worst, 1e-5 * max_abs(valid_ref)) << c.name << ": logits";

  // The loss and every LoRA gradient.
  const double loss = model->forward_backward(data.batch, data.count, false);
  const double ref_loss = read_doubles(ref, "loss")[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss)) << c.name;
  const auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model->grads);
  int checked = 0;
  for (const kqlora::ParamEntry* e : model->table().of_kind(kqlora::ParamKind::trainable)) {
    const auto g = read_doubles(ref, "grads/" + e->name);
    ASSERT_EQ(static_cast<int64_t>(g.size()), e->numel()) << e->name;
    double d = 0;
    for (int64_t i = 0; i < e->numel(); ++i)
      d = std::max(d, std::fabs(grads(e->offset + i) - g[i]));
    EXPECT_LE(d, 1e-4 * max_abs(g))
        << c.name << ": " << e->name << " (max |ref| " << max_abs(g) << ")";
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model->table().adapters.size()) * 2);
}

INSTANTIATE_TEST_SUITE_P(Cases, LlamaReference, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// kqlora-train over the same cases: 5 AdamW steps on the whole batch (global_bs 3), the
// per-step losses and the final adapters against PEFT's run (float32: tol 1e-4); the gqa
// case also in bfloat16, against the same run by PyTorch in bfloat16 (losses within 1%).
namespace {

const std::string train_bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-train";

std::string tmp_dir(const std::string& name) {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_llama_" + name;
}

std::vector<double> losses_of(const std::string& metrics) {
  std::ifstream f(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find("\"loss\": ");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 8)));
  }
  return out;
}

// Runs kqlora-train on case c; returns the save_dir.
std::string run_train(const Case& c, const std::string& tag, const std::string& extra) {
  const std::string dir = tmp_dir(c.name + tag);
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "# kqlora-train's keys for a reference case\nmodel = llama\n";
  const std::string cmd = train_bin + " " + dir + "/deck.in hf_model_dir=" + c.dir +
                          " data_file=" + c.dir + "/data.h5 lora_targets=" + c.targets +
                          " lora_rank=4 lora_alpha=8 block_size=32 scaler_block_size=32 "
                          "global_bs=3 num_steps=5 optimizer=adamw lr=1e-2 save_dir=" +
                          dir + "/ckpt metrics_file=" + dir + "/metrics.jsonl " + extra + " > " +
                          dir + "/log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_text(dir + "/log");
  return dir;
}

}  // namespace

TEST_P(LlamaReference, FiveAdamWStepsMatchPeft) {
  const Case& c = GetParam();
  const std::string dir = run_train(c, "", "init_file=" + c.dir + "/init.h5");
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto want = read_doubles(ref, "losses"), got = losses_of(dir + "/metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_NEAR(got[s], want[s], 1e-4 * std::fabs(want[s])) << c.name << " step " << s + 1;
  const std::string ckpt = dir + "/ckpt/step-00000005/rank-00000.h5";
  auto out = kqlora::h5::open_file(ckpt);
  auto final_ref = kqlora::h5::open_group(ref, "final");
  auto params = kqlora::h5::open_group(out, "params");
  int compared = 0;
  for (const auto& name : kqlora::h5::list_datasets(final_ref)) {
    const auto a = read_doubles(params, name), b = read_doubles(final_ref, name);
    ASSERT_EQ(a.size(), b.size()) << name;
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    EXPECT_LE(d, 1e-4 * max_abs(b)) << c.name << ": " << name;
    ++compared;
  }
  EXPECT_GE(compared, 4);
}

TEST(LlamaBfloat16, LossesWithinOnePercentOfPyTorchBfloat16) {
  const Case& c = kCases[0];  // gqa
  const std::string dir =
      run_train(c, "_bf16", "dtype=bfloat16 init_file=" + c.dir + "/init_adapters.h5");
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto want = read_doubles(ref, "losses_bf16"), got = losses_of(dir + "/metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_NEAR(got[s], want[s], 1e-2 * std::fabs(want[s])) << "step " << s + 1;
    std::printf("bfloat16 step %zu: kqlora %.6g, PyTorch %.6g\n", s + 1, got[s], want[s]);
  }
}
