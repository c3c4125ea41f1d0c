// The decoder (nn/causal_lm.hpp) against transformers + PEFT + torchao (float32, CPU), for
// every family: tests/data/llama_reference and tests/data/family_reference, written once by
// tools/gen_llama_reference.py. Each case is a
// random-initialised Hugging Face model directory; both sides use the NF4 dequantization
// of its projections (init.h5 holds torchao's NF4 components, which take precedence over
// model.safetensors; the dense tensors come from the model directory). Tolerances per
// tensor: max |diff| <= tol * max |ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "h5_test_util.hpp"
#include "kqlora/core/memory.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/nn/decoder_spec_diff.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/init.hpp"
#include "reference_case.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
const std::string ref_root = std::string(KQLORA_TEST_DATA_DIR) + "/llama_reference/";

using kqlora_test::max_abs;
using kqlora_test::read_text;

struct Case {
  std::string name, dir, targets;
  bool bf16 = false;        // reference.h5 has losses_bf16
  std::string eps;          // AdamW's eps of the reference's steps (empty: the default 1e-8)
  double bf16_rtol = 1e-2;  // the bfloat16 losses' tolerance, relative to PyTorch's
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// The other families' cases (tests/data/family_reference, the same generator): their
// case.txt names the LoRA targets and whether a bfloat16 run was recorded.
std::vector<Case> family_cases() {
  const std::string root = std::string(KQLORA_TEST_DATA_DIR) + "/family_reference/";
  std::vector<Case> out;
  for (const char* name :
       {"qwen2",       "qwen3",          "gemma2",      "gemma3_text",      "phi3",
        "phi3_long",   "mistral_window", "qwen3_moe",   "qwen3_moe_raw",    "qwen3_moe_experts",
        "mixtral",     "qwen3_moe_aux",  "olmoe",       "qwen2_moe",        "gpt_oss",
        "smollm3",     "olmo2",          "olmo3",       "granite",          "qwen3_5_text",
        "qwen3_5_moe", "qwen3_next",     "gemma4_text", "gemma4_kv_shared", "gemma4_ple",
        "gemma4_moe"}) {
    Case c{name, root + name, "all-linear"};
    std::ifstream f(c.dir + "/case.txt");
    for (std::string line; std::getline(f, line);) {
      const auto eq = line.find(" = ");
      if (eq == std::string::npos) continue;
      if (line.substr(0, eq) == "lora_targets") c.targets = line.substr(eq + 3);
      if (line.substr(0, eq) == "bf16") c.bf16 = line.substr(eq + 3) == "true";
      if (line.substr(0, eq) == "adamw_eps") c.eps = line.substr(eq + 3);
      if (line.substr(0, eq) == "bf16_rtol") c.bf16_rtol = std::stod(line.substr(eq + 3));
    }
    out.push_back(c);
  }
  return out;
}

const std::vector<Case> kCases = [] {
  std::vector<Case> v = {
      {"gqa", ref_root + "gqa", "all-linear", true},
      {"tied_head_dim", ref_root + "tied_head_dim", "all-linear"},
      {"llama3_qv", ref_root + "llama3_qv", "q_proj,v_proj"},
      {"mistral", ref_root + "mistral", "all-linear"},
  };
  for (const Case& c : family_cases()) v.push_back(c);
  return v;
}();

kqlora::ModelConfig config_of(const Case& c, kqlora::DType dtype = kqlora::DType::float32) {
  return kqlora_test::reference_config(c.dir, c.targets, dtype);
}

using kqlora_test::read_doubles;

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

std::unique_ptr<kqlora::CausalLm<Exec>> load(const Case& c,
                                             kqlora::DType dtype = kqlora::DType::float32) {
  auto model = std::make_unique<kqlora::CausalLm<Exec>>(Exec(), config_of(c, dtype));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), *model, c.dir + "/init.h5", log);
  return model;
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
  const int64_t V = model->spec().vocab;
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
  // (every trainable tensor: the projections' adapters, and the experts' where targeted)
  EXPECT_EQ(checked, static_cast<int>(model->table().of_kind(kqlora::ParamKind::trainable).size()));
  EXPECT_GE(checked, static_cast<int>(model->table().adapters.size()) * 2);
}

namespace {

/// The dropouts a case's determinism tests run with: with the experts as targets, none
/// (refused there, as PEFT refuses it on fused expert parameters).
std::vector<double> dropouts_of(const Case& c) {
  if (c.targets.find("experts.") != std::string::npos) return {0.0};
  return {0.0, 0.1};
}

struct PassResult {
  double loss = 0;
  std::vector<float> grads;
};

/// An evaluation pass over rows 0-1, a forward and backward over them, one accumulated over
/// row 2 alone (another width: the buffers are reused, not regrown), and one over all three
/// rows (the buffers regrown).
PassResult micro_batches(const Case& c, const kqlora::ModelConfig& cfg, const Data& data) {
  kqlora::CausalLm<Exec> model(Exec(), cfg);
  std::ostringstream log;
  // (init.h5 holds float32 NF4; a bfloat16 run quantizes the model directory's base)
  kqlora::initialize_model(Exec(), model, cfg.bf16() ? "" : c.dir + "/init.h5", log);
  kqlora::Batch<Mem> first = data.batch, second = data.batch;
  first.tokens = Kokkos::subview(data.batch.tokens, Kokkos::make_pair(0, 2), Kokkos::ALL);
  first.labels = Kokkos::subview(data.batch.labels, Kokkos::make_pair(0, 2), Kokkos::ALL);
  second.tokens = kqlora::TokenMatrix<Mem>("ids", 1, 9);
  second.labels = kqlora::TokenMatrix<Mem>("labels", 1, 9);
  auto ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), data.batch.tokens);
  auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), data.batch.labels);
  auto st = Kokkos::create_mirror_view(second.tokens);
  auto sl = Kokkos::create_mirror_view(second.labels);
  for (int t = 0; t < 9; ++t) st(0, t) = ht(2, t), sl(0, t) = hl(2, t);
  Kokkos::deep_copy(second.tokens, st);
  Kokkos::deep_copy(second.labels, sl);
  second.first_sample = 2;
  second.row_len = data.S;
  PassResult r;
  r.loss = model.loss(first, data.count);
  r.loss += model.forward_backward(first, data.count, false);
  r.loss += model.forward_backward(second, data.count, true);
  r.loss += model.forward_backward(data.batch, data.count, true);
  const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.grads);
  r.grads.assign(g.data(), g.data() + g.extent(0));
  return r;
}

/// Bit for bit the same loss and gradients (and not all zero).
void expect_identical(const PassResult& a, const PassResult& b, const std::string& what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) differ += a.grads[i] != b.grads[i];
  EXPECT_EQ(differ, 0u) << what;
  double norm = 0;
  for (float v : a.grads) norm += double(v) * v;
  EXPECT_GT(norm, 0) << what;
}

}  // namespace

// activation_checkpointing recomputes each block's forward in its backward: the same
// operations on the same values, so the loss and every gradient are bit for bit those of
// the run that keeps every block's activations -- with dropout too (the masks are keyed,
// not drawn) and over micro-batches of different widths.
// What preference objectives read of the model (nn/model.hpp): each row's summed
// log-probability of its scored tokens, against transformers' logits (float64 log-softmax
// here); the weighted backward, against forward_backward (whose gradients match PEFT's):
// weights -1/count give the cross-entropy's gradient, and the gradient is linear in the
// weights; use_weights runs the forward on other adapters, use_masters goes back.
TEST_P(LlamaReference, SequenceLogProbsAndWeightedBackward) {
  const Case& c = GetParam();
  // (one case a head and layer kind: a plain head, a soft-capped one, a divisor, experts,
  // Gated DeltaNet, Gemma 4's per-layer inputs)
  const std::set<std::string> kinds = {"gqa",       "llama3_qv",    "gemma2",    "granite",
                                       "qwen3_moe", "qwen3_5_text", "gemma4_ple"};
  if (!kinds.count(c.name)) GTEST_SKIP() << "covered by the other head and layer kinds";
  // (the router's load-balancing loss is no part of a sequence's log-probability)
  kqlora::ModelConfig cfg = config_of(c);
  cfg.router_aux_loss = "off";
  auto load_no_aux = [&] {
    auto m = std::make_unique<kqlora::CausalLm<Exec>>(Exec(), cfg);
    std::ostringstream log;
    kqlora::initialize_model(Exec(), *m, c.dir + "/init.h5", log);
    return m;
  };
  auto model = load_no_aux();
  Data data = read_data(c.dir);
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto ref_logits = read_doubles(ref, "logits");
  const int64_t V = model->spec().vocab, n = data.n, S = data.S;
  std::vector<int64_t> scored;
  const std::vector<double> logp = model->sequence_logps(data.batch, true, &scored);
  ASSERT_EQ(static_cast<int64_t>(logp.size()), n);
  for (int64_t s = 0; s < n; ++s) {
    double want = 0;
    int64_t count = 0;
    for (int64_t p = 0; p + 1 < S; ++p) {
      const int32_t label = data.labels[s * S + p + 1];
      if (label == kqlora::kIgnoreLabel) continue;
      const double* z = &ref_logits[(s * S + p) * V];
      const double m = *std::max_element(z, z + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - m);
      want += z[label] - m - std::log(sum);
      count += 1;
    }
    EXPECT_EQ(scored[s], count) << c.name << " row " << s;
    EXPECT_NEAR(logp[s], want, 1e-5 * std::max(1.0, std::fabs(want))) << c.name << " row " << s;
  }
  auto grads_of = [&](const std::vector<double>& w) {
    model->sequence_logps(data.batch, true);
    model->backward_weighted(w, false);
    auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model->grads);
    return std::vector<double>(g.data(), g.data() + g.extent(0));
  };
  const double loss = model->forward_backward(data.batch, data.count, false);
  auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model->grads);
  const std::vector<double> ce(g.data(), g.data() + g.extent(0));
  double total = 0;
  for (double v : logp) total -= v;
  EXPECT_NEAR(total / data.count, loss, 1e-6 * std::fabs(loss)) << c.name;
  const double scale = max_abs(ce);
  ASSERT_GT(scale, 0) << c.name;
  auto expect_close = [&](const std::vector<double>& a, const std::vector<double>& b,
                          const char* what) {
    ASSERT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    EXPECT_LE(d, 1e-5 * scale) << c.name << ": " << what;
  };
  expect_close(grads_of(std::vector<double>(n, -1.0 / data.count)), ce, "w = -1/count");
  std::vector<double> w(n), sum(ce.size(), 0.0);
  for (int64_t s = 0; s < n; ++s) {
    w[s] = (s % 2 ? -0.7 : 0.4) / data.count;  // (signs as a chosen / rejected pair's)
    std::vector<double> e(n, 0.0);
    e[s] = w[s];
    const auto gs = grads_of(e);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += gs[i];
  }
  expect_close(grads_of(w), sum, "linear in the weights");

  // use_weights: the forward over other adapters (the masters untouched), then back.
  auto other = load_no_aux();
  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), other->params);
  for (size_t i = 0; i < p.extent(0); ++i) p(i) += 0.01f * static_cast<float>(i % 7) - 0.03f;
  Kokkos::deep_copy(other->params, p);
  other->params_changed();
  const auto want_other = other->sequence_logps(data.batch, false);
  model->use_weights(other->params);
  EXPECT_EQ(model->sequence_logps(data.batch, false), want_other) << c.name;
  model->use_masters();
  EXPECT_EQ(model->sequence_logps(data.batch, false), logp) << c.name;
}

TEST_P(LlamaReference, ActivationCheckpointingGivesTheSameNumbers) {
  const Case& c = GetParam();
  const Data data = read_data(c.dir);
  for (double dropout : dropouts_of(c)) {
    std::vector<PassResult> runs;
    for (bool recompute : {false, true}) {
      auto cfg = config_of(c);
      cfg.dropout = dropout;
      cfg.activation_checkpointing = recompute;
      runs.push_back(micro_batches(c, cfg, data));
    }
    expect_identical(runs[0], runs[1], c.name + " dropout " + std::to_string(dropout));
  }
}

// activation_dtype = bfloat16 keeps a bfloat16 run's activations in 16 bits between the
// forward and the backward (the default on a GPU): they are bfloat16 values, so the loss and
// every gradient are bit for bit those of the run that keeps them in float32, with and
// without activation checkpointing and dropout.
TEST_P(LlamaReference, ActivationsKeptInBfloat16GiveTheSameNumbers) {
  const Case& c = GetParam();
  const Data data = read_data(c.dir);
  for (double dropout : dropouts_of(c))
    for (bool recompute : {false, true}) {
      std::vector<PassResult> runs;
      for (auto kept : {kqlora::ActivationDtype::float32, kqlora::ActivationDtype::bfloat16}) {
        auto cfg = config_of(c, kqlora::DType::bfloat16);
        cfg.dropout = dropout;
        cfg.activation_checkpointing = recompute;
        cfg.activation_dtype = kept;
        cfg.lora_b_zeros = false;  // (the adapters from the seed: every product non-zero)
        runs.push_back(micro_batches(c, cfg, data));
      }
      expect_identical(runs[0], runs[1],
                       c.name + " dropout " + std::to_string(dropout) +
                           (recompute ? " with activation checkpointing" : ""));
    }
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

/// The values of `key` ("loss", "eval_loss") in a metrics file, in order.
std::vector<double> losses_of(const std::string& metrics, const std::string& key = "loss") {
  std::ifstream f(metrics);
  std::vector<double> out;
  const std::string field = "\"" + key + "\": ";
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find(field);
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + field.size())));
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
                          dir + "/ckpt metrics_file=" + dir + "/metrics.jsonl " +
                          (c.eps.empty() ? std::string() : "eps=" + c.eps + " ") + extra + " > " +
                          dir + "/log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_text(dir + "/log");
  return dir;
}

// A run of 5 steps (run_train's save_dir) against PEFT's reference run of case c: the
// per-step losses and the final adapters within 1e-4.
/// A metric's values over the steps of a metrics.jsonl (empty: no step has it).
std::vector<double> metric_values(const std::string& metrics, const std::string& key) {
  std::ifstream f(metrics);
  std::vector<double> out;
  const std::string field = "\"" + key + "\": ";
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find(field);
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + field.size())));
  }
  return out;
}

void expect_matches_peft_run(const Case& c, const std::string& dir) {
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto want = read_doubles(ref, "losses"), got = losses_of(dir + "/metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_NEAR(got[s], want[s], 1e-4 * std::fabs(want[s])) << c.name << " step " << s + 1;
  // The router's load-balancing share, reported apart (the first step's: transformers').
  const auto aux = metric_values(dir + "/metrics.jsonl", "aux_loss");
  if (kqlora::h5::exists(ref, "aux_loss")) {
    ASSERT_EQ(aux.size(), want.size()) << c.name;
    const double want_aux = read_doubles(ref, "aux_loss")[0];
    EXPECT_NEAR(aux[0], want_aux, 1e-5 * want_aux) << c.name;
  } else {
    EXPECT_TRUE(aux.empty()) << c.name;
  }
  auto out = kqlora::h5::open_file(dir + "/ckpt/step-00000005/rank-00000.h5");
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

}  // namespace

TEST_P(LlamaReference, FiveAdamWStepsMatchPeft) {
  const Case& c = GetParam();
  expect_matches_peft_run(c, run_train(c, "", "init_file=" + c.dir + "/init.h5"));
}

// KQLORA_KERNEL_TIMES=1 (core/kernel_times.hpp): the table counts each kernel's launches --
// the RMSNorm's forward 2 a layer and the final one a forward: 2 layers, 2 steps, 10 -- and
// gives shares of the loop below 100%, and the time outside the kernels.
TEST(KernelTimes, CountLaunchesAndShareTheLoop) {
  const Case& c = kCases[0];
  const std::string dir = tmp_dir("kernel_times");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "model = causal_lm\n";
  const std::string cmd = "KQLORA_KERNEL_TIMES=1 " + train_bin + " " + dir +
                          "/deck.in hf_model_dir=" + c.dir + " data_file=" + c.dir +
                          "/data.h5 lora_rank=4 lora_alpha=8 global_bs=3 num_steps=2 lr=0 "
                          "save_dir=" +
                          dir + "/ckpt > " + dir + "/log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text(dir + "/log");
  const std::string log = read_text(dir + "/log");
  ASSERT_NE(log.find("kernel times (KQLORA_KERNEL_TIMES=1"), std::string::npos) << log;
  std::istringstream lines(log.substr(log.find("kernel times")));
  double shares = 0;
  int64_t norms = -1;
  bool outside = false;
  for (std::string line; std::getline(lines, line);) {
    const auto pct = line.find('%');
    if (pct == std::string::npos || line.find("shares of") != std::string::npos) continue;
    const double share = std::stod(line.substr(0, pct));
    EXPECT_GE(share, 0.0) << line;
    shares += share;
    if (line.find("outside Kokkos kernels") != std::string::npos) {
      outside = true;
      break;
    }
    const std::string label = "  kqlora::rms_norm_forward";
    if (line.size() > label.size() &&
        line.compare(line.size() - label.size(), label.size(), label) == 0)
      norms = std::stoll(line.substr(line.find(" s ") + 3));
  }
  EXPECT_TRUE(outside) << log;
  EXPECT_EQ(norms, 10) << log;
  EXPECT_NEAR(shares, 100.0, 0.5) << log;  // (the kernels and the rest: the whole loop)
}

// The cases with a bfloat16 run: gqa (Llama) and gemma2 (soft-caps, sandwich norms), each
// family's, within 1% of PyTorch's bfloat16 losses (a case's case.txt may say otherwise:
// gpt_oss's clamps, 1.5%).
TEST_P(LlamaReference, Bfloat16LossesWithinOnePercentOfPyTorchBfloat16) {
  const Case& c = GetParam();
  if (!c.bf16) GTEST_SKIP() << c.name << " has no bfloat16 reference run";
  const std::string dir =
      run_train(c, "_bf16", "dtype=bfloat16 init_file=" + c.dir + "/init_adapters.h5");
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto want = read_doubles(ref, "losses_bf16"), got = losses_of(dir + "/metrics.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_NEAR(got[s], want[s], c.bf16_rtol * std::fabs(want[s])) << "step " << s + 1;
    std::printf("bfloat16 step %zu: kqlora %.6g, PyTorch %.6g\n", s + 1, got[s], want[s]);
  }
}

// Import: config.json fields refused with the file, the field and the value; safetensors
// sources (F32, BF16, F16, sharded) and their errors; data files; empty batches.
#include <cstring>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/float16.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/train/checkpointing.hpp"
#include "kqlora/train/component_configs.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/trainer.hpp"

namespace {

std::string with_field(std::string json, const std::string& field, const std::string& value) {
  const std::string key = "\"" + field + "\": ";
  const auto at = json.find(key);
  if (at == std::string::npos) return "{" + key + value + ", " + json.substr(json.find('{') + 1);
  size_t end = at + key.size();
  if (json[end] == '{' || json[end] == '[') {  // an object or array: up to its close
    for (int depth = 0; end < json.size(); ++end) {
      depth += json[end] == '{' || json[end] == '['   ? 1
               : json[end] == '}' || json[end] == ']' ? -1
                                                      : 0;
      if (depth == 0) break;
    }
    ++end;
  } else {
    end = json.find_first_of(",\n}", end);
  }
  return json.substr(0, at + key.size()) + value + json.substr(end);
}

void expect_config_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    kqlora::parse_decoder_config(text, "dir/config.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const kqlora::InputError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

// float32 -> IEEE binary16, round to nearest even (finite inputs within its range).
uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  auto round = [](uint32_t kept, uint32_t rem, uint32_t mid) {
    return rem > mid || (rem == mid && (kept & 1)) ? kept + 1 : kept;
  };
  if (exp <= 0) {  // subnormal
    if (exp < -10) return static_cast<uint16_t>(sign);
    const uint32_t m = mant | 0x800000, shift = static_cast<uint32_t>(14 - exp);
    return static_cast<uint16_t>(sign |
                                 round(m >> shift, m & ((1u << shift) - 1), 1u << (shift - 1)));
  }
  return static_cast<uint16_t>(
      sign | round((static_cast<uint32_t>(exp) << 10) | (mant >> 13), mant & 0x1fff, 0x1000));
}

// Every tensor of a safetensors file, re-encoded (dtype F32, BF16 or F16) into `out`,
// optionally without one tensor or with one reshaped.
void rewrite(const std::string& in, const std::string& out, const std::string& dtype,
             const std::string& drop = "", const std::string& reshape = "") {
  const auto h = kqlora::safetensors::read_header(in);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<kqlora::safetensors::TensorToWrite> ts;
  for (const auto& t : h.tensors) {
    if (t.name == drop) continue;
    const auto raw = kqlora::safetensors::read_bytes(h, t);
    const float* f = reinterpret_cast<const float*>(raw.data());
    std::vector<uint8_t> b;
    if (dtype == "F32") {
      b = raw;
    } else {
      b.resize(static_cast<size_t>(t.numel()) * 2);
      uint16_t* o = reinterpret_cast<uint16_t*>(b.data());
      for (int64_t i = 0; i < t.numel(); ++i)
        o[i] = dtype == "BF16" ? kqlora::bfloat16(f[i]).bits : to_half(f[i]);
    }
    bytes.push_back(std::move(b));
    auto shape = t.shape;
    if (t.name == reshape) shape = {shape[0] / 2, shape[1] * 2};
    ts.push_back({t.name, dtype, shape, bytes.back().data(), bytes.back().size()});
  }
  kqlora::safetensors::write(out, ts);
}

std::string model_copy(const std::string& name) {
  const std::string dir = tmp_dir("import_" + name);
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + kCases[0].dir +
               "/config.json " + dir + "/")
                  .c_str());
  return dir;
}

std::unique_ptr<kqlora::CausalLm<Exec>> load_dir(const std::string& dir,
                                                 std::string* log = nullptr) {
  Case c{"x", dir, "all-linear"};
  auto model = std::make_unique<kqlora::CausalLm<Exec>>(Exec(), config_of(c));
  std::ostringstream os;
  kqlora::initialize_model(Exec(), *model, "", os);
  if (log) *log = os.str();
  return model;
}

// The NF4 bytes and dense values of two models are identical.
void expect_same_weights(kqlora::CausalLm<Exec>& a, kqlora::CausalLm<Exec>& b) {
  for (size_t i = 0; i < a.nf4.size(); ++i) {
    const auto x = kqlora::nf4_host(a.nf4[i]), y = kqlora::nf4_host(b.nf4[i]);
    ASSERT_EQ(x.quantized_data.extent(0), y.quantized_data.extent(0));
    for (size_t j = 0; j < x.quantized_data.extent(0); ++j)
      ASSERT_EQ(x.quantized_data(j), y.quantized_data(j)) << i << "," << j;
    EXPECT_EQ(x.scaler_mean, y.scaler_mean);
  }
  for (size_t i = 0; i < a.dense.size(); ++i) {
    auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.dense[i]);
    auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.dense[i]);
    for (size_t j = 0; j < x.extent(0); ++j) ASSERT_EQ(x(j), y(j)) << i << "," << j;
    auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.dense_bf16[i]);
    auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.dense_bf16[i]);
    ASSERT_EQ(p.extent(0), q.extent(0));
    for (size_t j = 0; j < p.extent(0); ++j) ASSERT_EQ(p(j).bits, q(j).bits) << i << "," << j;
  }
}

}  // namespace

TEST(LlamaImport, UnsupportedConfigFieldsNameFileFieldAndValue) {
  const std::string ok = read_text(kCases[0].dir + "/config.json");
  EXPECT_NO_THROW(kqlora::parse_decoder_config(ok, "c"));
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> bad = {
      {{"model_type", "\"gpt2\""}, "\"gpt2\""}, {{"hidden_act", "\"gelu\""}, "\"gelu\""},
      {{"attention_bias", "1"}, "1"},           {{"mlp_bias", "\"yes\""}, "\"yes\""},
      {{"sliding_window", "8"}, "8"},           {{"use_sliding_window", "true"}, "true"},
      {{"num_key_value_heads", "3"}, "3"},      {{"head_dim", "7"}, "7"},
      {{"vocab_size", "\"many\""}, "\"many\""}, {{"hidden_size", "0"}, "0"},
      {{"attention_dropout", "0.1"}, "0.1"},    {{"rms_norm_eps", "-1"}, "> 0"},
  };
  for (const auto& [fv, value] : bad)
    expect_config_error(with_field(ok, fv.first, fv.second),
                        {"dir/config.json", "'" + fv.first + "'", value});
  expect_config_error(with_field(ok, "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 2}"),
                      {"dir/config.json", "'rope_parameters.rope_type'", "\"yarn\""});
  expect_config_error(
      with_field(ok, "rope_parameters", "{\"rope_type\": \"llama3\", \"rope_theta\": 10000.0}"),
      {"'rope_parameters.factor'", "missing"});
  expect_config_error(with_field(ok, "rope_parameters",
                                 "{\"rope_type\": \"default\", "
                                 "\"partial_rotary_factor\": 0.5}"),
                      {"'rope_parameters.partial_rotary_factor'", "0.5"});
  // The pre-5.0 spelling: rope_theta at the top, rope_scaling with "type".
  std::string old = with_field(ok, "rope_parameters", "null");
  old = with_field(old, "rope_theta", "500000.0");
  expect_config_error(with_field(old, "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}"),
                      {"'rope_scaling.type'", "\"dynamic\""});
  const auto a = kqlora::parse_decoder_config(
      with_field(old, "rope_scaling",
                 "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}"),
      "c");
  // llama3's scaling at base 500000: the longest wavelength divided by the factor 8.
  ASSERT_EQ(a.ropes.size(), 1u);
  const float slowest = 1.0f / std::pow(500000.0f, 14.0f / 16.0f);
  EXPECT_FLOAT_EQ(a.ropes[0].inv_freq.back(), slowest / 8.0f);
  // Defaults: kv heads = heads, head_dim = hidden / heads.
  std::string minimal =
      "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, "
      "\"intermediate_size\": 16, \"num_hidden_layers\": 1, "
      "\"num_attention_heads\": 2}";
  const auto m = kqlora::parse_decoder_config(minimal, "c");
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.head_dim, 4);
  EXPECT_FLOAT_EQ(m.ropes[0].inv_freq[1], 1.0f / std::pow(10000.0f, 0.5f));
  EXPECT_FALSE(m.tied);
  EXPECT_FALSE(m.layer[0].window);
  // An absent dimension takes LlamaConfig's default (and says so).
  const auto d = kqlora::parse_decoder_config(
      minimal.replace(minimal.find("\"vocab_size\": 10, "), 18, ""), "c");
  EXPECT_EQ(d.vocab, 32000);
  EXPECT_NE(d.notes.at(0).find("vocab_size"), std::string::npos);
  // Fields that change the computation and are not implemented are refused by name.
  expect_config_error(with_field(ok, "quantization_config", "{\"bits\": 4}"),
                      {"dir/config.json", "'quantization_config'", "kqlora does not implement"});
}

TEST(LlamaImport, RankAboveTheSmallerSideIsRefused) {
  auto cfg = config_of(kCases[0]);
  cfg.rank = 33;  // k_proj is [32, 64]
  try {
    kqlora::CausalLm<Exec>::make_table(cfg);
    ADD_FAILURE();
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("k_proj [32, 64]"), std::string::npos) << e.what();
  }
}

// Public models' config.json spellings, as their model cards ship them (shapes cut down):
// Phi-4-mini's extra neutral fields and its rope_scaling with "type"; SmolLM2's
// transformers.js settings; Gemma 2 9B's sliding_window_size; transformers 4.48's
// _attn_implementation_autoset. Each is read, and a non-neutral value is refused.
TEST(LlamaImport, PublicModelsConfigSpellingsAreRead) {
  std::string factors;
  for (int i = 0; i < 48; ++i) factors += (i ? ", " : "") + std::to_string(1.0 + 0.01 * i);
  const std::string phi4 =
      "{\"architectures\": [\"Phi3ForCausalLM\"], \"attention_bias\": false, "
      "\"attention_dropout\": 0.0, \"auto_map\": {\"AutoConfig\": \"x\"}, "
      "\"bos_token_id\": 199999, \"embd_pdrop\": 0.0, \"eos_token_id\": 199999, "
      "\"full_attn_mod\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 3072, "
      "\"initializer_range\": 0.02, \"intermediate_size\": 8192, \"interpolate_factor\": 1, "
      "\"lm_head_bias\": false, \"max_position_embeddings\": 131072, \"mlp_bias\": false, "
      "\"model_type\": \"phi3\", \"num_attention_heads\": 24, \"num_hidden_layers\": 2, "
      "\"num_key_value_heads\": 8, \"original_max_position_embeddings\": 4096, "
      "\"pad_token_id\": 199999, \"partial_rotary_factor\": 0.75, \"resid_pdrop\": 0.0, "
      "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"long_factor\": [" +
      factors + "], \"short_factor\": [" + factors +
      "], \"type\": \"longrope\"}, \"rope_theta\": 10000.0, \"sliding_window\": 262144, "
      "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
      "\"transformers_version\": \"4.45.0\", \"use_cache\": true, \"vocab_size\": 200064, "
      "\"_attn_implementation_autoset\": true}";
  const auto p = kqlora::parse_decoder_config(phi4, "phi4/config.json");
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.ropes.at(0).rotary_dim, 96);
  EXPECT_EQ(p.ropes[0].long_above, 4096);
  EXPECT_FLOAT_EQ(p.ropes[0].attention_factor,
                  static_cast<float>(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));
  EXPECT_TRUE(p.tied);
  EXPECT_EQ(p.projections.size(), 4u);
  expect_config_error(with_field(phi4, "lm_head_bias", "true"),
                      {"'lm_head_bias'", "true", "no biases"});
  expect_config_error(with_field(phi4, "full_attn_mod", "2"), {"'full_attn_mod'", "2"});

  const std::string smollm2 = with_field(
      with_field(with_field(read_text(kCases[0].dir + "/config.json"), "is_llama_config", "true"),
                 "rope_interleaved", "false"),
      "transformers.js_config", "{\"kv_cache_dtype\": {\"q4f16\": \"float16\"}}");
  EXPECT_NO_THROW(kqlora::parse_decoder_config(smollm2, "c"));
  expect_config_error(with_field(smollm2, "rope_interleaved", "true"), {"'rope_interleaved'"});

  const std::string gemma = read_text(family_cases()[2].dir + "/config.json");
  ASSERT_NE(gemma.find("\"gemma2\""), std::string::npos);
  EXPECT_NO_THROW(
      kqlora::parse_decoder_config(with_field(gemma, "sliding_window_size", "37"), "c"));
  expect_config_error(with_field(gemma, "sliding_window_size", "4096"),
                      {"'sliding_window_size'", "4096", "sliding_window is 37"});
  // Both rope spellings must agree.
  expect_config_error(
      with_field(phi4, "rope_scaling", "{\"type\": \"longrope\", \"rope_type\": \"default\"}"),
      {"'rope_scaling.type'", "\"longrope\"", "rope_type is \"default\""});
}

// The spellings the references do not use give the same spec: Qwen2's sliding layers from
// use_sliding_window and max_window_layers instead of layer_types, Gemma 2's alternating
// default, Gemma 3's older rope_theta / rope_local_base_freq / rope_scaling instead of
// rope_parameters keyed by layer type.
TEST(LlamaImport, DefaultRulesAndOlderSpellingsGiveTheReferencesSpecs) {
  const auto cases = family_cases();
  auto spec_of = [](const std::string& text) { return kqlora::parse_decoder_config(text, "c"); };
  auto windows = [](const kqlora::DecoderSpec& s) {
    std::vector<int64_t> w;
    for (const auto& l : s.layer) w.push_back(l.window);
    return w;
  };
  const std::string qwen2 = read_text(cases[0].dir + "/config.json");
  const auto q_ref = spec_of(qwen2), q_old = spec_of(with_field(qwen2, "layer_types", "null"));
  EXPECT_EQ(windows(q_old), windows(q_ref));
  EXPECT_EQ(windows(q_ref), (std::vector<int64_t>{0, 37}));
  // use_sliding_window false: every layer full, whatever max_window_layers says.
  EXPECT_EQ(windows(spec_of(with_field(with_field(qwen2, "layer_types", "null"),
                                       "use_sliding_window", "false"))),
            (std::vector<int64_t>{0, 0}));

  const std::string gemma2 = read_text(cases[2].dir + "/config.json");
  EXPECT_EQ(windows(spec_of(with_field(gemma2, "layer_types", "null"))), windows(spec_of(gemma2)));

  const std::string gemma3 = read_text(cases[3].dir + "/config.json");
  std::string old = with_field(gemma3, "rope_parameters", "null");
  old = with_field(old, "rope_theta", "1000000.0");
  old = with_field(old, "rope_local_base_freq", "10000.0");
  old = with_field(old, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2.0}");
  const auto g_ref = spec_of(gemma3), g_old = spec_of(old);
  ASSERT_EQ(g_ref.ropes.size(), 2u);
  ASSERT_EQ(g_old.ropes.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(g_old.ropes[i].inv_freq, g_ref.ropes[i].inv_freq) << i;
  EXPECT_NE(g_ref.ropes[0].inv_freq, g_ref.ropes[1].inv_freq);  // global scaled, local not
  for (size_t l = 0; l < g_ref.layer.size(); ++l)
    EXPECT_EQ(g_ref.layer[l].rope, g_ref.layer[l].window > 0 ? 1 : 0) << l;
}

// lora_targets are the family's projection names, checked once config.json is read: a
// wrong one lists the valid ones (Phi-3's fused names, not Llama's).
TEST(LlamaImport, LoraTargetsAreTheFamilysProjections) {
  auto cfg = config_of(family_cases()[4]);  // phi3
  ASSERT_EQ(family_cases()[4].name, "phi3");
  cfg.lora_targets = "qkv_proj,gate_up_proj";
  const auto table = kqlora::CausalLm<Exec>::make_table(cfg);
  EXPECT_EQ(table.adapters.size(), 2u * 2);  // two projections, two layers
  EXPECT_NO_THROW(table.at("model.layers.1.self_attn.qkv_proj.lora_b.weight"));
  cfg.lora_targets = "q_proj";
  try {
    kqlora::CausalLm<Exec>::make_table(cfg);
    ADD_FAILURE() << "q_proj accepted for phi3";
  } catch (const kqlora::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'q_proj' is not a projection of phi3"), std::string::npos) << what;
    EXPECT_NE(what.find("qkv_proj,o_proj,gate_up_proj,down_proj"), std::string::npos) << what;
  }
}

// model = llama is an alias: the deck, the model text of checkpoints and the registry see
// causal_lm, and a checkpoint's text written as llama reads as causal_lm.
TEST(LlamaImport, LlamaIsAnAliasOfCausalLm) {
  EXPECT_EQ(kqlora::ModelConfig::from_text("model = llama\n", "ckpt").kind, "causal_lm");
  EXPECT_EQ(kqlora::canonical_model_kind("llama"), "causal_lm");
  EXPECT_EQ(kqlora::canonical_model_kind("lora_stack"), "lora_stack");
  const std::string dir = tmp_dir("alias");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "model = llama\nhf_model_dir = " << kCases[0].dir
                                  << "\ndata_file = " << kCases[0].dir << "/data.h5\n";
  const kqlora::Config c = kqlora::parse_deck(dir + "/deck.in", {});
  EXPECT_EQ(c.model, "causal_lm");
  EXPECT_EQ(kqlora::model_config(c).kind, "causal_lm");
}

// Qwen3-MoE's bad input (issue 50): the routing's sizes, the aux loss not implemented yet,
// and expert tensors missing, extra, in another layout or mis-shaped, each refused naming
// the file, the field or tensor and the value.
TEST(MoeImport, BadRoutingAndExpertTensorsAreRefusedNamingThem) {
  const Case c = family_cases()[7];
  ASSERT_EQ(c.name, "qwen3_moe");
  const std::string ok = read_text(c.dir + "/config.json");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"num_experts_per_tok", "9"},  // above the 8 experts
      {"num_experts_per_tok", "0"},  // none
      {"num_local_experts", "0"},    // no expert
      {"mlp_only_layers", "[3]"},    // not a layer
      {"router_aux_loss_coef", "-1"},
      {"num_experts_per_tok", "33"},
      // sizes beyond this node's memory, refused before any table row
      {"moe_intermediate_size", "100000000000"},
      {"num_local_experts", "100000000000"}};
  for (const auto& [field, value] : bad)
    expect_config_error(with_field(ok, field, value),
                        {"dir/config.json", "'" + field + "'", value});
  expect_config_error(with_field(ok, "num_experts", "4"), {"'num_experts'", "num_local_experts 8"});

  // The tensors: one expert's gate dropped, an expert 8 of 8 added, v5's fused layout
  // beside the hub's, an expert's down of the wrong shape.
  const auto src = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  auto rewrite = [&](const std::string& name, auto&& edit) {
    const std::string dir = tmp_dir("moe_bad_" + name);
    std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    std::ofstream(dir + "/config.json") << ok;
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    for (const auto& t : src.tensors) {
      bytes.push_back(kqlora::safetensors::read_bytes(src, t));
      ts.push_back({t.name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
    }
    edit(ts);
    kqlora::safetensors::write(dir + "/model.safetensors", ts);
    return dir;
  };
  const std::string gate0 = "model.layers.0.mlp.experts.3.gate_proj.weight";
  auto expect_refused = [&](const std::string& dir, const std::string& words) {
    try {
      load_dir(dir);
      ADD_FAILURE() << dir << ": accepted";
    } catch (const kqlora::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_refused(rewrite("missing",
                         [&](auto& ts) {
                           ts.erase(std::find_if(ts.begin(), ts.end(),
                                                 [&](const auto& t) { return t.name == gate0; }));
                         }),
                 gate0);
  expect_refused(rewrite("extra",
                         [&](auto& ts) {
                           auto t = *std::find_if(ts.begin(), ts.end(),
                                                  [&](const auto& x) { return x.name == gate0; });
                           t.name = "model.layers.2.mlp.experts.8.gate_proj.weight";
                           ts.push_back(t);
                         }),
                 "'model.layers.2.mlp.experts.8.gate_proj.weight' is not one the config.json");
  // Both layouts at once: refused, naming both.
  expect_refused(rewrite("both",
                         [&](auto& ts) {
                           auto t = *std::find_if(ts.begin(), ts.end(),
                                                  [&](const auto& x) { return x.name == gate0; });
                           t.name = "model.layers.0.mlp.experts.gate_up_proj";
                           ts.push_back(t);
                         }),
                 "the experts in two layouts");
  expect_refused(rewrite("shape",
                         [&](auto& ts) {
                           for (auto& t : ts)
                             if (t.name == "model.layers.2.mlp.experts.5.down_proj.weight")
                               t.shape = {t.shape[1], t.shape[0]};
                         }),
                 "model.layers.2.mlp.experts.5.down_proj.weight' has shape [32, 64], expected "
                 "[64, 32]");

  // transformers 5's fused layout ([E, 2I, hidden] gate_up_proj, [E, hidden, I] down_proj,
  // as its save_pretrained writes them): the same NF4 bytes as the hub's per-expert tensors.
  const int64_t E = 8, I = 32, H = 64;
  std::vector<std::vector<float>> fused;
  fused.reserve(4);  // (the tensors point into them)
  const std::string fused_dir = rewrite("fused", [&](auto& ts) {
    for (int l : {0, 2}) {
      const std::string m = "model.layers." + std::to_string(l) + ".mlp.experts.";
      std::vector<float> gate_up(E * 2 * I * H), down(E * H * I);
      for (int64_t j = 0; j < E; ++j)
        for (int w = 0; w < 3; ++w) {
          const std::string name = m + std::to_string(j) + "." +
                                   (w == 0   ? "gate_proj"
                                    : w == 1 ? "up_proj"
                                             : "down_proj") +
                                   ".weight";
          const auto it =
              std::find_if(ts.begin(), ts.end(), [&](const auto& x) { return x.name == name; });
          ASSERT_NE(it, ts.end()) << name;
          const float* v = static_cast<const float*>(it->data);
          float* to = w < 2 ? gate_up.data() + (j * 2 * I + w * I) * H : down.data() + j * H * I;
          std::copy(v, v + I * H, to);
          ts.erase(it);
        }
      fused.push_back(std::move(gate_up));
      fused.push_back(std::move(down));
      ts.push_back({m + "gate_up_proj",
                    "F32",
                    {E, 2 * I, H},
                    fused[fused.size() - 2].data(),
                    4 * fused[fused.size() - 2].size()});
      ts.push_back(
          {m + "down_proj", "F32", {E, H, I}, fused.back().data(), 4 * fused.back().size()});
    }
  });
  auto per_expert = load_dir(rewrite("hub", [](auto&) {}));
  std::string log;
  auto from_fused = load_dir(fused_dir, &log);
  expect_same_weights(*per_expert, *from_fused);
  EXPECT_EQ(log.find("not read"), std::string::npos) << log;
}

// OLMoE's fields (issue 50): a clip_qkv that is not a positive number, and a head_dim
// other than hidden / heads (OlmoeAttention's q_norm is hidden_size wide), each refused
// naming the file, the field and the value; clip_qkv null is none.
TEST(MoeImport, OlmoeClipAndHeadDimAreCheckedNamingThem) {
  const Case c = family_cases()[12];
  ASSERT_EQ(c.name, "olmoe");
  const std::string ok = read_text(c.dir + "/config.json");
  for (const char* value : {"0", "-1.5", "true"})
    expect_config_error(with_field(ok, "clip_qkv", value),
                        {"dir/config.json", "'clip_qkv'", value});
  expect_config_error(with_field(ok, "head_dim", "8"), {"dir/config.json", "'head_dim'", "8"});
  EXPECT_EQ(kqlora::parse_decoder_config(with_field(ok, "clip_qkv", "null"), "c").clip_qkv, 0.0f);
  const kqlora::DecoderSpec s = kqlora::parse_decoder_config(ok, "c");
  EXPECT_EQ(s.clip_qkv, 1.5f);
  EXPECT_TRUE(s.norm(kqlora::NormRole::q)->whole);
  EXPECT_EQ(s.norm_width(*s.norm(kqlora::NormRole::k)), s.kv_features());
}

// The 2026 families' fields (issue 51), each out of range or inconsistent value refused
// naming the file, the field and the value: SmolLM3's no_rope_layers and windows, OLMo 3's
// layer_types and ropes, Granite's multipliers, and Granite 4's hybrid model_type.
TEST(NewFamilies, BadFieldsAreRefusedNamingThem) {
  const auto config = [](const char* name) {
    for (const Case& c : family_cases())
      if (c.name == name) return read_text(c.dir + "/config.json");
    ADD_FAILURE() << "no case " << name;
    return std::string();
  };
  const std::string smol = config("smollm3"), olmo3 = config("olmo3"), granite = config("granite"),
                    qwen35 = config("qwen3_5_text"), q35moe = config("qwen3_5_moe"),
                    next = config("qwen3_next"), g4 = config("gemma4_text"),
                    g4moe = config("gemma4_moe"), g4kv = config("gemma4_kv_shared"),
                    g4ple = config("gemma4_ple");
  const std::vector<std::tuple<const std::string*, std::string, std::string>> bad = {
      {&smol, "no_rope_layers", "[1, 0]"},
      {&smol, "no_rope_layers", "[1, 2, 1]"},
      {&smol, "no_rope_layer_interval", "0"},
      {&smol, "layer_types", "[\"full_attention\", \"sliding_attention\"]"},
      {&smol, "layer_types", "[\"full_attention\", \"linear_attention\", \"full_attention\"]"},
      {&smol, "use_sliding_window", "false"},  // (yet layers 1 and 2 are typed sliding)
      {&olmo3, "layer_types", "[\"sliding_attention\"]"},
      {&olmo3, "sliding_window", "0"},
      {&olmo3, "rope_parameters",
       "{\"full_attention\": {\"rope_type\": \"longrope\", \"rope_theta\": 10000}}"},
      {&granite, "embedding_multiplier", "0"},
      {&granite, "residual_multiplier", "-0.5"},
      {&granite, "attention_multiplier", "true"},
      {&granite, "logits_scaling", "0"},
      {&granite, "model_type", "\"granitemoehybrid\""},
      {&qwen35, "linear_num_value_heads", "6"},  // (not a multiple of 4 key heads)
      {&qwen35, "linear_conv_kernel_dim", "0"},
      {&qwen35, "linear_key_head_dim", "0"},
      {&qwen35, "linear_key_head_dim", "1000000000"},  // (in_proj_qkv beyond any node)
      {&qwen35, "layer_types",
       "[\"linear_attention\", \"sliding_attention\", "
       "\"linear_attention\", \"full_attention\"]"},
      {&qwen35, "layer_types", "[\"full_attention\"]"},
      {&qwen35, "attn_output_gate", "false"},
      {&qwen35, "rope_parameters",
       "{\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5, "
       "\"mrope_section\": [1, 1, 1]}"},
      // (Qwen3.5-MoE: fields its config class removes, accepted only as transformers runs)
      {&q35moe, "decoder_sparse_step", "2"},
      {&q35moe, "norm_topk_prob", "false"},
      {&q35moe, "mlp_only_layers", "[1]"},
      {&q35moe, "num_experts_per_tok", "9"},  // (more than 8 experts)
      {&q35moe, "shared_expert_intermediate_size", "0"},
      {&next, "linear_num_value_heads", "6"},
      {&next, "decoder_sparse_step", "0"},
      {&next, "mlp_only_layers", "[4]"},
      {&next, "moe_intermediate_size", "-1"},
      // (Gemma 4: what is not read yet, refused; per-layer heads that cannot be)
      {&g4, "hidden_size_per_layer_input", "-1"},
      {&g4, "num_kv_shared_layers", "4"},            // (no layer left to compute them)
      {&g4, "num_kv_shared_layers", "3"},            // (layer 1, full: no earlier full layer)
      {&g4moe, "top_k_experts", "9"},                // (more than its 8 experts)
      {&g4ple, "vocab_size_per_layer_input", "95"},  // (token 95 would have no row)
      // (layer 3 shares layer 2's keys and values, of 2 heads: 4 of its own refused)
      {&g4kv, "per_layer_config",
       "{\"1\": {\"head_dim\": 32, \"num_key_value_heads\": 1}, \"4\": {\"head_dim\": 32, "
       "\"num_key_value_heads\": 1}, \"3\": {\"num_key_value_heads\": 4}}"},
      {&g4moe, "moe_intermediate_size", "0"},
      {&g4, "use_bidirectional_attention", "\"all\""},
      {&g4, "per_layer_config", "{\"1\": {\"head_dim\": 32, \"num_key_value_heads\": 3}}"},
      {&g4, "per_layer_config", "{\"7\": {\"head_dim\": 32}}"},
      {&g4, "per_layer_config", "{\"1\": {\"head_dim\": 32, \"sliding_window\": 8}}"},
      {&g4, "final_logit_softcapping", "0"},
      {&g4, "rope_parameters", "{\"full_attention\": {\"rope_type\": \"yarn\"}}"}};
  for (const auto& [text, field, value] : bad) {
    SCOPED_TRACE(field + " = " + value);
    const std::string shown = value.find("longrope") != std::string::npos ? "longrope"
                              : value.find("mrope") != std::string::npos  ? "mrope_section"
                              : value[0] == '[' || value[0] == '"' || value[0] == '{' ? ""
                                                                                      : value;
    expect_config_error(with_field(*text, field, value), {"dir/config.json", field, shown});
  }
  const auto refusal = [](const std::string& text) {
    try {
      kqlora::parse_decoder_config(text, "dir/config.json");
    } catch (const kqlora::InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(with_field(granite, "model_type", "\"granitemoehybrid\"")).find("Mamba-2"),
            std::string::npos);
}

// What the new fields mean: SmolLM3's rope-less layers by default (every fourth), OLMo 2's
// post-norms over whole q/k projections, OLMo 3's hub spelling (rope_theta and a flat
// rope_scaling, which transformers applies to the full-attention layers only) equal to
// transformers 5's per-layer-type rope_parameters, Granite's multipliers (1: none).
TEST(NewFamilies, FieldsGiveTheSpecTransformersBuilds) {
  const auto config = [](const char* name) {
    for (const Case& c : family_cases())
      if (c.name == name) return read_text(c.dir + "/config.json");
    return std::string();
  };
  std::string smol = config("smollm3");
  smol = with_field(with_field(smol, "no_rope_layers", "null"), "num_hidden_layers", "8");
  smol = with_field(with_field(smol, "layer_types", "null"), "use_sliding_window", "false");
  const kqlora::DecoderSpec s = kqlora::parse_decoder_config(smol, "c");
  for (int64_t l = 0; l < 8; ++l) {
    EXPECT_EQ(s.layer[l].rotary, (l + 1) % 4 != 0) << l;
    EXPECT_EQ(s.layer[l].window, 0) << l;
  }
  const kqlora::DecoderSpec o2 = kqlora::parse_decoder_config(config("olmo2"), "c");
  EXPECT_EQ(o2.norm(kqlora::NormRole::attn_in), nullptr);
  EXPECT_EQ(o2.norm(kqlora::NormRole::mlp_in), nullptr);
  EXPECT_EQ(o2.norm(kqlora::NormRole::attn_out)->kind, kqlora::NormKind::float32);
  EXPECT_EQ(o2.norm_width(*o2.norm(kqlora::NormRole::k)), o2.kv_features());

  const std::string v5 = config("olmo3");
  const std::string hub = with_field(
      with_field(with_field(v5, "rope_parameters", "null"), "rope_theta", "500000.0"),
      "rope_scaling",
      "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}");
  const kqlora::DecoderSpec a = kqlora::parse_decoder_config(v5, "c"),
                            b = kqlora::parse_decoder_config(hub, "c");
  EXPECT_EQ(kqlora::first_spec_difference(a, b), "");
  ASSERT_EQ(a.ropes.size(), 2u);
  EXPECT_EQ(a.ropes[0].type, "yarn");
  EXPECT_EQ(a.ropes[1].type, "default");
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(a.layer[l].rope, l == 3 ? 0 : 1) << l;

  const std::string granite = config("granite");
  const kqlora::DecoderSpec g = kqlora::parse_decoder_config(granite, "c");
  EXPECT_EQ(g.embed_multiplier, 6.0f);
  EXPECT_EQ(g.residual_multiplier, 0.5f);
  EXPECT_EQ(g.attn_scale, 0.3f);
  EXPECT_EQ(g.logits_divisor, 3.0f);
  const kqlora::DecoderSpec one = kqlora::parse_decoder_config(
      with_field(with_field(granite, "logits_scaling", "1.0"), "residual_multiplier", "1"), "c");
  EXPECT_EQ(one.logits_divisor, 0.0f);
  EXPECT_EQ(one.residual_multiplier, 0.0f);

  // Qwen3.5-MoE: every layer sparse beside a shared expert, the top k renormalised;
  // Qwen3-Next: decoder_sparse_step 2 (layers 1 and 3), its fused Gated DeltaNet
  // projections grouped per key head, each group [q_h | k_h | v_h | z_h] and [b_h | a_h].
  const kqlora::DecoderSpec m = kqlora::parse_decoder_config(config("qwen3_5_moe"), "c");
  for (int64_t l = 0; l < 4; ++l) EXPECT_TRUE(m.layer[l].sparse) << l;
  EXPECT_TRUE(m.experts.norm_topk);
  EXPECT_EQ(m.experts.shared_intermediate, 48);
  EXPECT_EQ(m.mlp_width(0), 48);
  const kqlora::DecoderSpec n = kqlora::parse_decoder_config(config("qwen3_next"), "c");
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(n.layer[l].sparse, l % 2 == 1) << l;
  EXPECT_FALSE(n.experts.norm_topk);
  const kqlora::ProjectionSpec& qkvz = n.projections[n.writer(kqlora::Slot::lin_z)];
  EXPECT_EQ(qkvz.name, "in_proj_qkvz");
  EXPECT_EQ(qkvz.groups, 4);
  const auto pieces = n.pieces(qkvz);
  ASSERT_EQ(pieces.size(), 4u);
  const int64_t kw = n.linear.key_width(), vw = n.linear.value_width();
  EXPECT_EQ(pieces[1].col0, kw);
  EXPECT_EQ(pieces[2].col0, 2 * kw);
  EXPECT_EQ(pieces[2].width, vw);
  EXPECT_EQ(pieces[3].slot, kqlora::Slot::lin_z);
  EXPECT_EQ(n.out_features(qkvz), 2 * kw + 2 * vw);
  EXPECT_EQ(n.projections[n.writer(kqlora::Slot::lin_a)].name, "in_proj_ba");

  // Gemma 4: the full layers' heads from per_layer_config (transformers 5.25's) equal the
  // hub's global_head_dim and num_global_key_value_heads; v = k on them; proportional rope
  // over the whole head (8 of 16 pairs rotated), zero frequencies after.
  const std::string g4 = config("gemma4_text");
  const kqlora::DecoderSpec v525 = kqlora::parse_decoder_config(g4, "c");
  const kqlora::DecoderSpec hub4 = kqlora::parse_decoder_config(
      with_field(with_field(with_field(g4, "per_layer_config", "null"), "global_head_dim", "32"),
                 "num_global_key_value_heads", "1"),
      "c");
  EXPECT_EQ(kqlora::first_spec_difference(v525, hub4), "");
  // (transformers' save_pretrained pads the keys with zeros past 10 layers: "01", "03")
  const kqlora::DecoderSpec padded = kqlora::parse_decoder_config(
      with_field(g4, "per_layer_config",
                 "{\"01\": {\"head_dim\": 32, \"num_key_value_heads\": 1}, "
                 "\"03\": {\"head_dim\": 32, \"num_key_value_heads\": 1}}"),
      "c");
  EXPECT_EQ(kqlora::first_spec_difference(v525, padded), "");
  // (the hub's 31B: bidirectional attention among image tokens, none on text)
  EXPECT_EQ(kqlora::first_spec_difference(
                v525, kqlora::parse_decoder_config(
                          with_field(g4, "use_bidirectional_attention", "\"vision\""), "c")),
            "");
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(v525.head_dim_of(l), l % 2 ? 32 : 16) << l;
    EXPECT_EQ(v525.kv_heads_of(l), l % 2 ? 1 : 2) << l;
    EXPECT_EQ(v525.layer[l].k_eq_v, l % 2 == 1) << l;
  }
  const kqlora::RopeSpec& full = v525.ropes[v525.layer[1].rope];
  ASSERT_EQ(full.inv_freq.size(), 16u);
  EXPECT_EQ(full.rotary_dim, 32);
  EXPECT_FLOAT_EQ(full.inv_freq[1], static_cast<float>(std::pow(1e6, -2.0 / 32)));
  EXPECT_EQ(full.inv_freq[7] > 0 && full.inv_freq[8] == 0, true);
  // (no per_layer_config and no global_head_dim: transformers' 512)
  const kqlora::DecoderSpec dflt =
      kqlora::parse_decoder_config(with_field(g4, "per_layer_config", "null"), "c");
  EXPECT_EQ(dflt.head_dim_of(1), 512);
  EXPECT_EQ(dflt.kv_heads_of(1), 2);  // (num_global_key_value_heads absent: the layer's own)

  // Gemma 4 as the hub ships it (model_type gemma4): text_config's decoder, its tensors and
  // the exports' names under model.language_model., the towers skipped; a text_config of
  // another model_type and a disagreeing tie_word_embeddings refused naming the field.
  const std::string mm =
      "{\"model_type\": \"gemma4\", \"tie_word_embeddings\": true, "
      "\"vision_config\": {\"hidden_size\": 32}, \"audio_config\": null, "
      "\"image_token_id\": 90, \"text_config\": " +
      g4 + "}";
  const kqlora::DecoderSpec m4 = kqlora::parse_decoder_config(mm, "c");
  EXPECT_EQ(kqlora::first_spec_difference(m4, v525), "model_type: gemma4 vs gemma4_text");
  EXPECT_EQ(m4.file_prefix, "model.language_model.");
  EXPECT_EQ(m4.loaded_prefix, "model.language_model.");
  ASSERT_EQ(m4.skipped.size(), 4u);
  EXPECT_EQ(m4.skipped[0].first, "model.vision_tower.");
  expect_config_error(with_field(mm, "tie_word_embeddings", "false"),
                      {"dir/config.json", "'tie_word_embeddings'", "false"});
  expect_config_error(mm.substr(0, mm.find("\"text_config\"")) + "\"text_config\": " +
                          with_field(g4, "model_type", "\"gemma3_text\"") + "}",
                      {"dir/config.json", "model_type", "gemma3_text"});
}

// Qwen3.5 as the hub ships it (issue 51): a multimodal qwen3_5 directory (the text
// decoder's fields under text_config, its tensors under model.language_model., a vision
// tower and a multi-token prediction head beside them) loads the text case's bytes, says
// what it skips, and gives the text case's numbers; text_config of another model_type
// and a tie_word_embeddings disagreeing with text_config's are refused naming the field.
TEST(NewFamilies, Qwen35MultimodalDirectoryReadsTheTextDecoder) {
  Case text;
  for (const Case& c : family_cases())
    if (c.name == "qwen3_5_text") text = c;
  ASSERT_FALSE(text.dir.empty());
  const std::string cfg = read_text(text.dir + "/config.json");
  const std::string multimodal =
      "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", "
      "\"image_token_id\": 90, \"video_token_id\": 91, \"vision_start_token_id\": 92, "
      "\"vision_end_token_id\": 93, \"tie_word_embeddings\": false, "
      "\"vision_config\": {\"depth\": 1, \"hidden_size\": 32}, \"text_config\": " +
      cfg + "}";
  const std::string dir = tmp_dir("qwen3_5_multimodal");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/config.json") << multimodal;
  const auto src = kqlora::safetensors::read_header(text.dir + "/model.safetensors");
  std::vector<std::vector<uint8_t>> bytes;
  bytes.reserve(src.tensors.size() + 2);
  std::vector<kqlora::safetensors::TensorToWrite> ts;
  for (const auto& t : src.tensors) {
    bytes.push_back(kqlora::safetensors::read_bytes(src, t));
    const std::string name = t.name.rfind("model.", 0) == 0
                                 ? "model.language_model." + t.name.substr(6)
                                 : t.name;  // (lm_head.weight keeps its name)
    ts.push_back({name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
  }
  const std::vector<float> extra(64, 0.5f);
  ts.push_back({"model.visual.blocks.0.attn.proj.weight", "F32", {8, 8}, extra.data(), 256});
  ts.push_back({"mtp.fc.weight", "F32", {8, 8}, extra.data(), 256});
  kqlora::safetensors::write(dir + "/model.safetensors", ts);

  std::string log;
  auto a = load_dir(text.dir);
  auto b = load_dir(dir, &log);
  expect_same_weights(*a, *b);
  EXPECT_NE(log.find("under 'model.visual.' are not read: the vision tower"), std::string::npos)
      << log;
  EXPECT_NE(log.find("under 'mtp.' are not read"), std::string::npos) << log;
  EXPECT_EQ(log.find("are not read ("), std::string::npos) << log;  // (nothing else unread)
  const Data d = read_data(text.dir);
  EXPECT_EQ(a->loss(d.batch, d.count), b->loss(d.batch, d.count));

  expect_config_error(with_field(multimodal, "tie_word_embeddings", "true"),
                      {"dir/config.json", "'tie_word_embeddings'", "true"});
  const std::string other = multimodal.substr(0, multimodal.find("\"text_config\"")) +
                            "\"text_config\": " + with_field(cfg, "model_type", "\"qwen3_text\"") +
                            "}";
  expect_config_error(other, {"dir/config.json", "'text_config.model_type'", "qwen3_text"});
}

// Gemma 4's per-layer table is held in bfloat16 (2 bytes a value) where config.json's dtype
// says its values are bfloat16 ones: the same model as that table in float32, bit for bit
// (loss, gradients, the base's hash), half its bytes in the memory estimate; a float32 file
// whose values are not bfloat16 under such a config is refused, naming the element.
TEST(LlamaImport, Gemma4PerLayerTableHeldInBfloat16) {
  const Case c = family_cases()[24];
  ASSERT_EQ(c.name, "gemma4_ple");
  const std::string table = "model.embed_tokens_per_layer.weight";
  const auto src = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  // The case with its table rounded to bfloat16: `dtype` in config.json, the table stored
  // as BF16 or as F32 (the same values); `exact` false: the original float32 values.
  auto write_case = [&](const std::string& name, const std::string& dtype, bool bf16_file,
                        bool exact) {
    const std::string dir = tmp_dir(name);
    std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    std::ofstream(dir + "/config.json")
        << with_field(read_text(c.dir + "/config.json"), "dtype", "\"" + dtype + "\"");
    std::vector<std::vector<uint8_t>> bytes;
    bytes.reserve(src.tensors.size());
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    for (const auto& t : src.tensors) {
      bytes.push_back(kqlora::safetensors::read_bytes(src, t));
      std::string dt = t.dtype;
      if (t.name == table && exact) {
        std::vector<float> v(static_cast<size_t>(t.numel()));
        std::memcpy(v.data(), bytes.back().data(), bytes.back().size());
        std::vector<uint8_t> out;
        for (float x : v) {
          const kqlora::bfloat16 b(x);
          const float w = static_cast<float>(b);
          const auto* p = reinterpret_cast<const uint8_t*>(
              bf16_file ? static_cast<const void*>(&b.bits) : static_cast<const void*>(&w));
          out.insert(out.end(), p, p + (bf16_file ? 2 : 4));
        }
        bytes.back() = out;
        dt = bf16_file ? "BF16" : "F32";
      }
      ts.push_back({t.name, dt, t.shape, bytes.back().data(), bytes.back().size()});
    }
    kqlora::safetensors::write(dir + "/model.safetensors", ts);
    return dir;
  };
  auto load_case = [&](const std::string& dir) {
    Case k{"x", dir, c.targets};
    auto m = std::make_unique<kqlora::CausalLm<Exec>>(Exec(), config_of(k));
    std::ostringstream os;
    kqlora::initialize_model(Exec(), *m, "", os);
    return m;
  };
  auto compact = load_case(write_case("g4_table_bf16", "bfloat16", true, true));
  auto wide = load_case(write_case("g4_table_f32", "float32", false, true));
  const kqlora::ParamEntry& e = compact->table().at(table);
  ASSERT_TRUE(e.compact);
  EXPECT_FALSE(wide->table().at(table).compact);
  EXPECT_EQ(compact->dense[e.offset].extent(0), 0u);
  ASSERT_EQ(static_cast<int64_t>(compact->dense_bf16[e.offset].extent(0)), e.numel());
  // (the same values, read back through the two storages)
  const auto x = compact->dense_host(e), y = wide->dense_host(wide->table().at(table));
  ASSERT_EQ(x.extent(0), y.extent(0));
  for (size_t i = 0; i < x.extent(0); ++i) ASSERT_EQ(x(i), y(i)) << i;
  EXPECT_EQ(kqlora::model_base_hash(*compact), kqlora::model_base_hash(*wide));

  Data d = read_data(c.dir);
  auto grads = [&](kqlora::CausalLm<Exec>& m) {
    const double loss = m.forward_backward(d.batch, d.count, false);
    auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.grads);
    return std::make_pair(loss, std::vector<float>(g.data(), g.data() + g.extent(0)));
  };
  const auto [la, ga] = grads(*compact);
  const auto [lb, gb] = grads(*wide);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(ga, gb);
  // (a table that changes the loss: the lookup reads it)
  EXPECT_NE(la, load_dir(c.dir)->loss(d.batch, d.count));

  // The memory estimate counts it at 2 bytes a value.
  const auto fa =
      kqlora::model_footprint(config_of(Case{"x", tmp_dir("g4_table_bf16"), c.targets}));
  const auto fb = kqlora::model_footprint(config_of(Case{"x", tmp_dir("g4_table_f32"), c.targets}));
  EXPECT_EQ(fa.compact_dense_elements, e.numel());
  EXPECT_EQ(fb.compact_dense_elements, 0);
  EXPECT_EQ(fa.dense_elements, fb.dense_elements);

  // A float32 table whose values are not bfloat16 ones, under dtype bfloat16: refused.
  const std::string bad = write_case("g4_table_inexact", "bfloat16", false, false);
  try {
    load_case(bad);
    ADD_FAILURE() << "no error";
  } catch (const kqlora::InputError& err) {
    const std::string w = err.what();
    for (const std::string& part : {bad + "/model.safetensors", "'" + table + "' element ",
                                    std::string("not a bfloat16 value")})
      EXPECT_NE(w.find(part), std::string::npos) << w;
  }
}

// Mixtral in transformers 5's names (what its save_pretrained writes: mlp.gate, the fused
// mlp.experts.gate_up_proj and down_proj) loads the same bytes as in the hub's
// (block_sparse_moe.gate, block_sparse_moe.experts.<j>.w1 / w3 / w2).
TEST(MoeImport, MixtralInTransformers5NamesLoadsTheHubsBytes) {
  const Case c = family_cases()[10];
  ASSERT_EQ(c.name, "mixtral");
  const auto src = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  const int64_t E = 4, I = 32, H = 64;
  const std::string dir = tmp_dir("mixtral_v5");
  std::system(
      ("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + c.dir + "/config.json " + dir + "/")
          .c_str());
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> fused(4);
  std::vector<kqlora::safetensors::TensorToWrite> ts;
  for (const auto& t : src.tensors) {
    bytes.push_back(kqlora::safetensors::read_bytes(src, t));
    std::string name = t.name;
    const auto moe = name.find(".block_sparse_moe.");
    if (moe == std::string::npos) {
      ts.push_back({name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
      continue;
    }
    const int l = std::stoi(name.substr(13, moe - 13));
    if (name.find(".gate.weight") != std::string::npos) {  // the router
      name = "model.layers." + std::to_string(l) + ".mlp.gate.weight";
      ts.push_back({name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
      continue;
    }
    // block_sparse_moe.experts.<j>.w<k>.weight: into its layer's fused tensors
    const auto j0 = name.find(".experts.") + 9;
    const int64_t j = std::stoll(name.substr(j0, name.find('.', j0) - j0));
    const char w = name[name.find(".w", j0) + 2];
    auto& gate_up = fused[2 * l];
    auto& down = fused[2 * l + 1];
    gate_up.resize(E * 2 * I * H);
    down.resize(E * H * I);
    const float* v = reinterpret_cast<const float*>(bytes.back().data());
    float* to = w == '1'   ? gate_up.data() + (j * 2 * I) * H
                : w == '3' ? gate_up.data() + (j * 2 * I + I) * H
                           : down.data() + j * H * I;
    std::copy(v, v + I * H, to);
  }
  for (int l = 0; l < 2; ++l) {
    const std::string m = "model.layers." + std::to_string(l) + ".mlp.experts.";
    ts.push_back(
        {m + "gate_up_proj", "F32", {E, 2 * I, H}, fused[2 * l].data(), 4 * fused[2 * l].size()});
    ts.push_back(
        {m + "down_proj", "F32", {E, H, I}, fused[2 * l + 1].data(), 4 * fused[2 * l + 1].size()});
  }
  kqlora::safetensors::write(dir + "/model.safetensors", ts);
  Case hub{"hub", c.dir, "all-linear"}, v5{"v5", dir, "all-linear"};
  kqlora::CausalLm<Exec> a(Exec(), config_of(hub)), b(Exec(), config_of(v5));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), a, "", log);
  kqlora::initialize_model(Exec(), b, "", log);
  expect_same_weights(a, b);
  EXPECT_EQ(log.str().find("not read"), std::string::npos) << log.str();
}

// gpt-oss's experts (issue 50): transformers 5's unquantized layout (gate_up_proj [E, H, 2I]
// with gate and up in even and odd columns, down_proj [E, I, H], as a dequantized
// save_pretrained writes them) loads the same NF4 bytes as the hub's MXFP4 blocks and
// scales, decoded here by the format's definition (quant/mxfp4.hpp is not used).
TEST(MoeImport, GptOssUnquantizedLayoutLoadsTheMxfp4Bytes) {
  const Case c = family_cases()[14];
  ASSERT_EQ(c.name, "gpt_oss");
  const auto src = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  const std::string dir = tmp_dir("gpt_oss_v5");
  std::system(
      ("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + c.dir + "/config.json " + dir + "/")
          .c_str());
  const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::map<std::string, std::vector<uint8_t>> raw;
  for (const auto& t : src.tensors) raw[t.name] = kqlora::safetensors::read_bytes(src, t);
  std::vector<std::vector<float>> plain;
  plain.reserve(8);
  std::vector<kqlora::safetensors::TensorToWrite> ts;
  int decoded = 0;
  for (const auto& t : src.tensors) {
    const auto at = t.name.rfind("_blocks");
    if (at == std::string::npos) {
      if (t.name.find("_scales") == std::string::npos)
        ts.push_back({t.name, t.dtype, t.shape, raw[t.name].data(), raw[t.name].size()});
      continue;
    }
    // [E, rows, cols / 32, 16] -> [E, rows, cols] -> transposed [E, cols, rows]
    const std::string name = t.name.substr(0, at);
    const auto& b = raw[t.name];
    const auto& sc = raw[name + "_scales"];
    const int64_t E = t.shape[0], rows = t.shape[1], cols = t.shape[2] * 32;
    std::vector<float> out(static_cast<size_t>(E * rows * cols));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k) {
          const int64_t block = (e * rows + r) * (cols / 32) + k / 32;
          const uint8_t byte = b[static_cast<size_t>(block * 16 + (k % 32) / 2)];
          const int code = k % 2 == 0 ? byte & 15 : byte >> 4;
          out[static_cast<size_t>((e * cols + k) * rows + r)] =
              std::ldexp(fp4[code], static_cast<int>(sc[static_cast<size_t>(block)]) - 127);
        }
    plain.push_back(std::move(out));
    ts.push_back({name, "F32", {E, cols, rows}, plain.back().data(), 4 * plain.back().size()});
    ++decoded;
  }
  ASSERT_EQ(decoded, 4);  // (two layers, gate_up and down)
  kqlora::safetensors::write(dir + "/model.safetensors", ts);
  std::string log;
  auto hub = load_dir(c.dir, &log);
  auto v5 = load_dir(dir, &log);
  expect_same_weights(*hub, *v5);
  EXPECT_EQ(log.find("not read"), std::string::npos) << log;
}

// gpt-oss's bad input (issue 50): an MXFP4 scale of 255 (E8M0's NaN), a value past float32's
// range, blocks of the wrong shape, scales missing, both layouts at once; the config's
// quantization, experts_per_token, swiglu fields and YaRN factor -- each refused naming the
// file, the tensor or field and the value.
TEST(MoeImport, GptOssBadExpertsAndFieldsAreRefusedNamingThem) {
  const Case c = family_cases()[14];
  ASSERT_EQ(c.name, "gpt_oss");
  const std::string ok = read_text(c.dir + "/config.json");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"experts_per_token", "3"},   {"swiglu_limit", "0"},        {"swiglu_alpha", "-1"},
      {"num_experts_per_tok", "0"}, {"num_experts_per_tok", "9"}, {"num_local_experts", "0"}};
  for (const auto& [field, value] : bad)
    expect_config_error(with_field(ok, field, value),
                        {"dir/config.json", "'" + field + "'", value});
  expect_config_error(with_field(ok, "quantization_config", "{\"quant_method\": \"fp8\"}"),
                      {"dir/config.json", "'quantization_config.quant_method'", "fp8"});
  expect_config_error(
      with_field(ok, "rope_parameters",
                 "{\"rope_type\": \"yarn\", \"factor\": 0.5, \"original_max_position_embeddings\": "
                 "64, \"rope_theta\": 10000}"),
      {"dir/config.json", "factor", "0.5"});
  expect_config_error(with_field(ok, "router_jitter_noise", "0.1"),
                      {"dir/config.json", "'router_jitter_noise'"});

  const auto src = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  auto rewrite = [&](const std::string& name, auto&& edit) {
    const std::string dir = tmp_dir("gpt_oss_bad_" + name);
    std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
    std::ofstream(dir + "/config.json") << ok;
    std::vector<std::vector<uint8_t>> bytes;
    bytes.reserve(src.tensors.size() + 1);
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    for (const auto& t : src.tensors) {
      bytes.push_back(kqlora::safetensors::read_bytes(src, t));
      ts.push_back({t.name, t.dtype, t.shape, bytes.back().data(), bytes.back().size()});
    }
    edit(ts, bytes);
    kqlora::safetensors::write(dir + "/model.safetensors", ts);
    return dir;
  };
  auto expect_refused = [&](const std::string& dir, const std::vector<std::string>& words) {
    try {
      load_dir(dir);
      ADD_FAILURE() << dir << ": accepted";
    } catch (const kqlora::InputError& e) {
      for (const auto& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
    }
  };
  const std::string m = "model.layers.1.mlp.experts.";
  auto find = [](auto& ts, const std::string& name) {
    return std::find_if(ts.begin(), ts.end(), [&](const auto& t) { return t.name == name; });
  };
  // (the scales and blocks are written from `bytes`: edit the copy a tensor points into)
  auto bytes_of = [&](auto& ts, auto& bytes, const std::string& name) -> std::vector<uint8_t>& {
    const auto it = find(ts, name);
    return bytes[static_cast<size_t>(it - ts.begin())];
  };
  expect_refused(
      rewrite("nan_scale",
              [&](auto& ts, auto& bytes) { bytes_of(ts, bytes, m + "down_proj_scales")[5] = 255; }),
      {m + "down_proj'", "scale byte 255"});
  expect_refused(rewrite("inf_value",
                         [&](auto& ts, auto& bytes) {
                           bytes_of(ts, bytes, m + "gate_up_proj_scales")[0] = 254;
                           bytes_of(ts, bytes, m + "gate_up_proj_blocks")[0] = 0x77;  // 6, 6
                         }),
                 {m + "gate_up_proj'", "inf"});
  expect_refused(rewrite("blocks_shape",
                         [&](auto& ts, auto&) {
                           auto it = find(ts, m + "down_proj_blocks");
                           it->shape = {it->shape[0], it->shape[1] / 2, it->shape[2] * 2, 16};
                         }),
                 {m + "down_proj_blocks'", "expected"});
  expect_refused(
      rewrite("no_scales", [&](auto& ts, auto&) { ts.erase(find(ts, m + "down_proj_scales")); }),
      {m + "down_proj_scales'"});
  std::vector<float> zeros(8 * 64 * 64);
  expect_refused(
      rewrite(
          "both",
          [&](auto& ts, auto&) {
            ts.push_back({m + "gate_up_proj", "F32", {8, 64, 64}, zeros.data(), 4 * zeros.size()});
          }),
      {"two layouts"});
}

// The model FLOPs count each query's visible keys: min(position + 1, window) on sliding
// layers (mistral_window: every layer, window 37), position + 1 on full ones.
TEST(LlamaImport, TrainFlopsCountTheWindowsScores) {
  const Case c = family_cases()[6];
  ASSERT_EQ(c.name, "mistral_window");
  const auto cfg = config_of(c);
  const kqlora::DecoderSpec s = kqlora::decoder_spec_of(cfg);
  ASSERT_EQ(s.layer[0].window, 37);
  auto full = s;
  for (auto& l : full.layer) l.window = 0;
  const std::vector<bool> all(s.projections.size(), true);
  const int64_t n = 3, T = 136;
  double saved_pairs = 0;  // per sequence: the keys a window hides
  for (int64_t p = 0; p < T; ++p)
    saved_pairs += static_cast<double>(p + 1 - std::min<int64_t>(p + 1, 37));
  const double per_pair = static_cast<double>(s.layers * s.heads) * 12.0 * s.head_dim * n;
  EXPECT_DOUBLE_EQ(kqlora::decoder_train_flops(full, 4, all, n, T) -
                       kqlora::decoder_train_flops(s, 4, all, n, T),
                   per_pair * saved_pairs);
}

TEST(LlamaImport, Bfloat16Float16AndShardedSourcesGiveTheSameWeights) {
  const std::string src = kCases[0].dir + "/model.safetensors";
  // F32 holding bfloat16 values, and the BF16 file: the same model.
  const std::string f32 = model_copy("f32"), bf16 = model_copy("bf16");
  rewrite(src, bf16 + "/model.safetensors", "BF16");
  {
    const auto h = kqlora::safetensors::read_header(bf16 + "/model.safetensors");
    std::vector<std::vector<float>> vals;
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    for (const auto& t : h.tensors) {
      const auto raw = kqlora::safetensors::read_bytes(h, t);
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(
            kqlora::bfloat16::from_bits(reinterpret_cast<const uint16_t*>(raw.data())[i]));
      vals.push_back(std::move(v));
      ts.push_back({t.name, "F32", t.shape, vals.back().data(), vals.back().size() * 4});
    }
    kqlora::safetensors::write(f32 + "/model.safetensors", ts);
  }
  auto a = load_dir(f32), b = load_dir(bf16);
  expect_same_weights(*a, *b);
  // F16 widens to float32 exactly (every float16 is a float32).
  const std::string f16 = model_copy("f16"), f16_as_f32 = model_copy("f16_as_f32");
  rewrite(src, f16 + "/model.safetensors", "F16");
  {
    const auto h16 = kqlora::safetensors::read_header(f16 + "/model.safetensors");
    std::vector<std::vector<float>> vals;
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    for (const auto& t : h16.tensors) {
      const auto raw = kqlora::safetensors::read_bytes(h16, t);
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = kqlora::half_to_float(reinterpret_cast<const uint16_t*>(raw.data())[i]);
      vals.push_back(std::move(v));
      ts.push_back({t.name, "F32", t.shape, vals.back().data(), vals.back().size() * 4});
    }
    kqlora::safetensors::write(f16_as_f32 + "/model.safetensors", ts);
  }
  auto c16 = load_dir(f16), c32 = load_dir(f16_as_f32);
  expect_same_weights(*c16, *c32);
  // Sharded: two files and an index give the single file's model.
  const std::string sharded = model_copy("sharded");
  const auto h = kqlora::safetensors::read_header(src);
  std::ostringstream index;
  index << "{\"metadata\": {}, \"weight_map\": {";
  std::vector<std::vector<uint8_t>> keep;
  std::vector<kqlora::safetensors::TensorToWrite> s1, s2;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const auto& t = h.tensors[i];
    keep.push_back(kqlora::safetensors::read_bytes(h, t));
    (i % 2 ? s2 : s1).push_back({t.name, "F32", t.shape, keep.back().data(), keep.back().size()});
    index << (i ? ", " : "") << "\"" << t.name << "\": \"model-0000" << (i % 2 ? 2 : 1)
          << "-of-00002.safetensors\"";
  }
  index << "}}";
  kqlora::safetensors::write(sharded + "/model-00001-of-00002.safetensors", s1);
  kqlora::safetensors::write(sharded + "/model-00002-of-00002.safetensors", s2);
  std::ofstream(sharded + "/model.safetensors.index.json") << index.str();
  auto single = load_dir(kCases[0].dir), split = load_dir(sharded);
  expect_same_weights(*single, *split);
}

TEST(LlamaImport, MissingOrMisshapenTensorsNameTheFileAndTheTensor) {
  const std::string src = kCases[0].dir + "/model.safetensors";
  const std::string missing = model_copy("missing"), misshapen = model_copy("misshapen");
  rewrite(src, missing + "/model.safetensors", "F32", "model.layers.1.mlp.up_proj.weight");
  rewrite(src, misshapen + "/model.safetensors", "F32", "",
          "model.layers.0.self_attn.q_proj.weight");
  auto expect = [](const std::string& dir, const std::vector<std::string>& parts) {
    try {
      load_dir(dir);
      ADD_FAILURE() << dir << " accepted";
    } catch (const kqlora::InputError& e) {
      for (const auto& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  };
  expect(missing, {missing + "/model.safetensors", "model.layers.1.mlp.up_proj.weight"});
  expect(misshapen, {misshapen + "/model.safetensors", "model.layers.0.self_attn.q_proj.weight",
                     "[32, 128]", "[64, 64]"});
  expect(model_copy("empty"), {"model.safetensors.index.json"});
}

TEST(LlamaImport, TiedModelIgnoresAStoredHeadWithANote) {
  const Case& c = kCases[1];  // tied_head_dim
  const std::string dir = tmp_dir("import_tied_head");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir + " && cp " + c.dir + "/config.json " + dir)
                  .c_str());
  const auto h = kqlora::safetensors::read_header(c.dir + "/model.safetensors");
  std::vector<std::vector<uint8_t>> keep;
  std::vector<kqlora::safetensors::TensorToWrite> ts;
  for (const auto& t : h.tensors) {
    keep.push_back(kqlora::safetensors::read_bytes(h, t));
    ts.push_back({t.name, t.dtype, t.shape, keep.back().data(), keep.back().size()});
    if (t.name == "model.embed_tokens.weight")
      ts.push_back({"lm_head.weight", t.dtype, t.shape, keep.back().data(), keep.back().size()});
  }
  kqlora::safetensors::write(dir + "/model.safetensors", ts);
  Case copy{"tied", dir, "all-linear"};
  kqlora::CausalLm<Exec> model(Exec(), config_of(copy));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), model, "", log);
  EXPECT_EQ(model.table().find("lm_head.weight"), nullptr);
  EXPECT_NE(log.str().find("lm_head.weight: the head is tied to the embedding"), std::string::npos)
      << log.str();
}

namespace {
void write_tokens(const std::string& path, const std::vector<int32_t>& ids,
                  const std::vector<int32_t>& labels, int64_t rows, int64_t S, int64_t vocab) {
  auto f = kqlora::h5::create_file(path);
  kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {rows, S}, ids.data());
  kqlora::h5::write_dataset(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {rows, S}, labels.data());
  if (vocab > 0) kqlora::h5::write_attribute(f, "vocab_size", vocab);
}
}  // namespace

TEST(LlamaData, WrongVocabularyIsRefusedAndEmptyBatchesAreSkipped) {
  const Case& c = kCases[0];
  const std::string dir = tmp_dir("data");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const int64_t rows = 4, S = 6;
  std::vector<int32_t> ids(rows * S), labels(rows * S);
  for (int64_t i = 0; i < rows * S; ++i) ids[i] = labels[i] = static_cast<int32_t>(1 + i % 90);
  // Rows 2 and 3 (step 2 of global_bs 2) score nothing: a prompt, then padding.
  for (int64_t i = 2 * S; i < rows * S; ++i) labels[i] = kqlora::kIgnoreLabel;
  write_tokens(dir + "/ok.h5", ids, labels, rows, S, 96);
  write_tokens(dir + "/vocab.h5", ids, labels, rows, S, 50257);
  ids[5] = 96;
  write_tokens(dir + "/id.h5", ids, labels, rows, S, 0);
  const std::vector<std::string> base = {"model=llama",          "hf_model_dir=" + c.dir,
                                         "lora_rank=4",          "block_size=32",
                                         "scaler_block_size=32", "global_bs=2",
                                         "num_steps=3",          "lr=1e-2",
                                         "checkpoint_every=0",   "save_dir=" + dir + "/ckpt"};
  auto deck = [&](const std::string& data) {
    auto keys = base;
    keys.push_back("data_file=" + data);
    return kqlora::parse_deck_text("", "t", keys);
  };
  for (const auto& [file, what] : std::vector<std::pair<std::string, std::string>>{
           {"vocab.h5", "vocab_size 50257"}, {"id.h5", "= 96 is outside"}}) {
    std::ostringstream log;
    try {
      kqlora::train(deck(dir + "/" + file), log);
      ADD_FAILURE() << file << " accepted";
    } catch (const kqlora::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/" + file), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  std::ostringstream log;
  const auto s = kqlora::train(deck(dir + "/ok.h5"), log);
  EXPECT_EQ(s.steps_empty, 1) << log.str();
  ASSERT_EQ(s.losses.size(), 3u);
  EXPECT_TRUE(std::isfinite(s.losses[0]));
  EXPECT_TRUE(std::isnan(s.losses[1]));
  EXPECT_TRUE(std::isfinite(s.losses[2]));
  EXPECT_NE(log.str().find("step 2: the global batch has no scored label"), std::string::npos)
      << log.str();
  // No update: after the skipped step the adapters and Adam's moments are step 1's.
  auto keys = base;
  keys.push_back("data_file=" + dir + "/ok.h5");
  keys.push_back("checkpoint_every=1");
  keys.push_back("num_steps=2");
  keys.push_back("save_dir=" + dir + "/every");
  std::ostringstream log2;
  kqlora::train(kqlora::parse_deck_text("", "t", keys), log2);
  auto one = kqlora::h5::open_file(dir + "/every/step-00000001/rank-00000.h5");
  auto two = kqlora::h5::open_file(dir + "/every/step-00000002/rank-00000.h5");
  int compared = 0;
  for (const std::string group : {"params", "optimizer"}) {
    auto g1 = kqlora::h5::open_group(one, group), g2 = kqlora::h5::open_group(two, group);
    for (const auto& name : kqlora::h5::list_datasets(g1)) {
      if (name.find("lora_") == std::string::npos) continue;
      EXPECT_EQ(read_doubles(g1, name), read_doubles(g2, name)) << group << "/" << name;
      ++compared;
    }
  }
  EXPECT_GE(compared, 3 * 28);  // 28 adapter tensors, each with two moments
}

// Block sizes torchao refuses (a partial last scaler block in every projection): the NF4
// kqlora imports from model.safetensors equals the scalar reference built from docs/NF4.md,
// byte for byte and in its dequantized values, in float32 and bfloat16.
#include "nf4_reference.hpp"

TEST(LlamaImport, PartialScalerBlocksMatchTheDocumentedReference) {
  const auto h = kqlora::safetensors::read_header(kCases[0].dir + "/model.safetensors");
  for (const auto dtype : {kqlora::DType::float32, kqlora::DType::bfloat16}) {
    auto cfg = config_of(kCases[0], dtype);
    cfg.block_size = 16;
    cfg.scaler_block_size = 40;  // e.g. k_proj: 128 blocks, scaler blocks 40 x 3 + 8
    kqlora::CausalLm<Exec> model(Exec(), cfg);
    std::ostringstream log;
    kqlora::initialize_model(Exec(), model, "", log);
    int checked = 0;
    for (const kqlora::ParamEntry* e : model.table().of_kind(kqlora::ParamKind::nf4)) {
      const auto raw = kqlora::safetensors::read_bytes(h, *h.find(e->name));
      std::vector<float> w(reinterpret_cast<const float*>(raw.data()),
                           reinterpret_cast<const float*>(raw.data()) + e->numel());
      const bool bf16 = dtype == kqlora::DType::bfloat16;
      if (bf16)
        for (auto& x : w) x = kqlora::round_to_bf16(x);
      ASSERT_NE(e->nf4_layout().num_blocks() % 40, 0) << e->name << ": no partial block";
      const auto ref = nf4ref::quantize(w, 16, 40, bf16);
      const auto t = kqlora::nf4_host(model.nf4[e->offset]);
      ASSERT_EQ(t.quantized_data.extent(0), ref.data.size());
      for (size_t i = 0; i < ref.data.size(); ++i)
        ASSERT_EQ(t.quantized_data(i), ref.data[i]) << e->name << " byte " << i;
      for (size_t i = 0; i < ref.scalers.size(); ++i)
        ASSERT_EQ(t.quantized_scalers(i), ref.scalers[i]) << e->name << " scaler " << i;
      EXPECT_EQ(t.scaler_mean, ref.mean) << e->name;
      Kokkos::View<float*, Mem> deq("deq", e->numel());
      kqlora::nf4_dequantize<float>(Exec(), model.nf4[e->offset], deq);
      auto dh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), deq);
      for (int64_t i = 0; i < e->numel(); ++i)
        ASSERT_EQ(dh(i), ref.dequantized[i]) << e->name << " value " << i;
      ++checked;
    }
    EXPECT_EQ(checked, 14);
  }
}

namespace {

/// Rows `order` of a case's data.h5, each followed by `pad` more positions (id 0, label
/// -100), as the token file `path`.
void write_rows(const Case& c, const std::vector<int>& order, int64_t pad,
                const std::string& path) {
  auto f = kqlora::h5::open_file(c.dir + "/data.h5");
  const auto d = kqlora::h5::dataset_dims(f, "input_ids", c.dir);
  std::vector<int32_t> ids(d[0] * d[1]), labels(ids.size());
  kqlora::h5::read_dataset(f, "input_ids", H5T_NATIVE_INT32, ids.size(), ids.data(), c.dir);
  kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, ids.size(), labels.data(), c.dir);
  const int64_t S = d[1] + pad, rows = static_cast<int64_t>(order.size());
  std::vector<int32_t> out_ids(rows * S, 0), out_labels(rows * S, kqlora::kIgnoreLabel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < d[1]; ++t) {
      out_ids[r * S + t] = ids[order[r] * d[1] + t];
      out_labels[r * S + t] = labels[order[r] * d[1] + t];
    }
  write_tokens(path, out_ids, out_labels, rows, S, 0);
}

/// The loss of reference.h5's logits over rows `order` (float64): the cross-entropy sum
/// over every scored label divided by their count.
double reference_loss(const Case& c, const std::vector<int>& order) {
  const Data d = read_data(c.dir);
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto logits = read_doubles(ref, "logits");
  const int64_t V = static_cast<int64_t>(logits.size()) / (d.n * d.S);
  double sum = 0, count = 0;
  for (int r : order)
    for (int64_t t = 0; t + 1 < d.S; ++t) {
      const int32_t y = d.labels[r * d.S + t + 1];
      if (y == kqlora::kIgnoreLabel) continue;
      const double* z = logits.data() + (r * d.S + t) * V;
      double m = z[0], e = 0;
      for (int64_t v = 1; v < V; ++v) m = std::max(m, z[v]);
      for (int64_t v = 0; v < V; ++v) e += std::exp(z[v] - m);
      sum += m + std::log(e) - z[y];
      count += 1;
    }
  return sum / count;
}
}  // namespace

// Each micro-batch is trimmed to its longest scored row: one row per micro-batch (three
// widths) and seven more padding positions per row give PEFT's losses and adapters.
TEST(LlamaData, TrimmedMicroBatchesMatchPeft) {
  const Case& c = kCases[0];
  const std::string dir = tmp_dir("trim");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  write_rows(c, {0, 1, 2}, 7, dir + "/padded.h5");
  expect_matches_peft_run(
      c, run_train(c, "_trim",
                   "init_file=" + c.dir + "/init.h5 micro_bs=1 data_file=" + dir + "/padded.h5"));
}

// Evaluation covers every row of eval_file: five rows in global batches of 2 (the last
// one short, micro-batches of one row trimmed each) give the loss of PEFT's logits over
// the five.
TEST(LlamaData, EvaluationCoversTheWholeEvalFile) {
  const Case& c = kCases[0];
  const std::string dir = tmp_dir("eval");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::vector<int> order = {0, 1, 2, 1, 2};
  write_rows(c, order, 3, dir + "/eval.h5");
  // lr 0: the model stays the reference's initial one.
  const std::string run =
      run_train(c, "_eval",
                "init_file=" + c.dir + "/init.h5 lr=0 num_steps=2 global_bs=2 " +
                    "micro_bs=1 eval_every=1 eval_file=" + dir + "/eval.h5");
  const auto got = losses_of(run + "/metrics.jsonl", "eval_loss");
  ASSERT_EQ(got.size(), 2u) << read_text(run + "/log");
  const double want = reference_loss(c, order);
  for (double g : got) EXPECT_NEAR(g, want, 1e-5 * want);
  // Not the first global batch's loss alone.
  EXPECT_GT(std::fabs(reference_loss(c, {0, 1}) - want), 1e-3 * want);
}

// shuffle: each epoch a permutation of the rows, another each epoch, the same for a seed;
// a step straddling two epochs takes the end of one and the start of the next.
TEST(LlamaData, ShuffleIsASeededPermutationPerEpoch) {
  const std::string dir = tmp_dir("shuffle");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const int64_t rows = 10, S = 3, gbs = 4;
  std::vector<int32_t> ids(rows * S), labels(rows * S);
  for (int64_t i = 0; i < rows * S; ++i) ids[i] = labels[i] = static_cast<int32_t>(i / S);
  write_tokens(dir + "/rows.h5", ids, labels, rows, S, 96);
  kqlora::InputSpec spec;
  spec.tokens = true;
  spec.vocab = 96;
  auto order = [&](uint64_t seed, bool shuffle) {  // the rows of the first 3 epochs
    const kqlora::DataSource src(dir + "/rows.h5", spec, gbs, seed, "t", shuffle);
    std::vector<int32_t> got;
    std::vector<int32_t> i(gbs * S), l(gbs * S);
    for (int64_t step = 0; step * gbs < 3 * rows; ++step) {
      src.tokens(step, 0, gbs, i.data(), l.data());
      for (int64_t k = 0; k < gbs; ++k) got.push_back(i[k * S]);
    }
    got.resize(3 * rows);
    return got;
  };
  const auto a = order(42, true), plain = order(42, false);
  EXPECT_EQ(a, order(42, true));
  EXPECT_NE(a, order(43, true));
  std::vector<std::vector<int32_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int32_t> ep(a.begin() + e * rows, a.begin() + (e + 1) * rows);
    EXPECT_NE(ep, std::vector<int32_t>(plain.begin(), plain.begin() + rows)) << "epoch " << e;
    epochs.push_back(ep);
    std::sort(ep.begin(), ep.end());
    EXPECT_EQ(ep, std::vector<int32_t>(plain.begin(), plain.begin() + rows)) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

// init_file = a PEFT adapter directory: the adapters under PEFT's names are the
// checkpoint's; a directory whose LoRA configuration is not the deck's is refused, naming
// adapter_config.json and what differs.
TEST(LlamaImport, PeftAdapterDirectoryAsInitFile) {
  const Case& c = kCases[0];
  const std::string dir = tmp_dir("peft_init");
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  auto reference = load(c);  // adapters from init.h5 (non-zero A and B)
  const auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reference->params);
  std::vector<kqlora::safetensors::TensorToWrite> tensors;
  for (const auto& a : reference->table().adapters)
    for (const auto& [name, peft] :
         {std::pair<std::string, std::string>{a.a, "lora_A"}, {a.b, "lora_B"}}) {
      const kqlora::ParamEntry& e = reference->table().at(name);
      tensors.push_back({"base_model.model." + a.module + "." + peft + ".weight", "F32", e.shape,
                         hp.data() + e.offset, static_cast<size_t>(4 * e.numel())});
    }
  kqlora::safetensors::write(dir + "/adapter_model.safetensors", tensors, {});
  auto config = [&](const std::string& fields) {
    std::ofstream(dir + "/adapter_config.json") << "{\"peft_type\": \"LORA\", " << fields << "}\n";
  };
  config("\"r\": 4, \"lora_alpha\": 8");
  kqlora::CausalLm<Exec> model(Exec(), config_of(c));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), model, dir, log);
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params);
  ASSERT_EQ(got.extent(0), hp.extent(0));
  for (size_t i = 0; i < got.extent(0); ++i) ASSERT_EQ(got(i), hp(i)) << i;
  EXPECT_NE(log.str().find("28 tensors from " + dir + ","), std::string::npos) << log.str();
  for (const auto& [extra, what] : std::vector<std::pair<std::string, std::string>>{
           {"\"r\": 8, \"lora_alpha\": 8", "r 8 differs from lora_rank 4"},
           {"\"r\": 4, \"lora_alpha\": 16", "lora_alpha 16 differs from lora_alpha 8"},
           {"\"r\": 4, \"lora_alpha\": 8, \"use_rslora\": true",
            "use_rslora = true is not supported"}}) {
    config(extra);
    try {
      kqlora::CausalLm<Exec> m(Exec(), config_of(c));
      kqlora::initialize_model(Exec(), m, dir, log);
      ADD_FAILURE() << extra << " accepted";
    } catch (const kqlora::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(dir + "/adapter_config.json"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

// checkpoint_base: auto writes the adapters, the optimizer state and the base's hash, no
// frozen tensor; true writes the base. kqlora-diff finds the two equal (the hash the run
// computed from its model against the hash of the stored base, read back) and
// kqlora-export --merged gives the same tensors from either (auto: quantized again).
#include <sys/wait.h>

TEST(LlamaCheckpoints, CheckpointBaseAutoStoresTheHashNotTheBase) {
  const Case& c = kCases[0];
  const std::string bin = std::string(KQLORA_TEST_BIN_DIR);
  const std::string with_base = run_train(c, "_base_true", "checkpoint_base=true");
  const std::string by_hash = run_train(c, "_base_auto", "");
  const std::string f_true = with_base + "/ckpt/step-00000005/rank-00000.h5";
  const std::string f_auto = by_hash + "/ckpt/step-00000005/rank-00000.h5";
  {
    auto t = kqlora::h5::open_file(f_true);
    auto a = kqlora::h5::open_file(f_auto);
    EXPECT_FALSE(kqlora::h5::has_attribute(t, "base_hash"));
    const std::string hash = kqlora::h5::read_string_attribute(a, "base_hash", f_auto);
    EXPECT_EQ(hash.size(), 16u) << hash;
    auto pt = kqlora::h5::open_group(t, "params"), pa = kqlora::h5::open_group(a, "params");
    EXPECT_TRUE(kqlora::h5::is_nf4_group(pt, "model.layers.0.self_attn.q_proj.weight"));
    EXPECT_FALSE(kqlora::h5::exists(pa, "model.layers.0.self_attn.q_proj.weight"));
    EXPECT_TRUE(kqlora::h5::exists(pt, "model.embed_tokens.weight"));
    EXPECT_FALSE(kqlora::h5::exists(pa, "model.embed_tokens.weight"));
    EXPECT_TRUE(kqlora::h5::exists(pa, "model.layers.0.self_attn.q_proj.lora_a.weight"));
  }
  auto run = [](const std::string& cmd, const std::string& log) {
    const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
    return std::make_pair(rc, read_text(log));
  };
  const auto [rc, diff] = run(bin + "/kqlora-diff " + f_true + " " + f_auto + " --rtol 0 --atol 0",
                              by_hash + "/diff.log");
  EXPECT_EQ(rc, 0) << diff;
  EXPECT_NE(diff.find("base (hash"), std::string::npos) << diff;
  for (const std::string& d : {with_base, by_hash}) {
    const auto [erc, out] =
        run(bin + "/kqlora-export " + d + "/ckpt --merged " + d + "/merged", d + "/export.log");
    ASSERT_EQ(erc, 0) << out;
  }
  const auto a = kqlora::safetensors::read_header(with_base + "/merged/model.safetensors");
  const auto b = kqlora::safetensors::read_header(by_hash + "/merged/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& t : a.tensors) {
    const auto* u = b.find(t.name);
    ASSERT_TRUE(u) << t.name;
    EXPECT_EQ(kqlora::safetensors::read_bytes(a, t), kqlora::safetensors::read_bytes(b, *u))
        << t.name;
  }
  // A restart on another base (torchao's NF4 from init.h5: its scaler_mean differs in the
  // last bit, docs/NF4.md): refused, naming the hashes.
  const auto [rrc, refused] =
      run(train_bin + " " + by_hash + "/deck.in hf_model_dir=" + c.dir + " data_file=" + c.dir +
              "/data.h5 lora_rank=4 lora_alpha=8 block_size=32 scaler_block_size=32 " +
              "optimizer=adamw lr=1e-2 global_bs=3 num_steps=6 save_dir=" + by_hash +
              "/ckpt restart=latest init_file=" + c.dir + "/init.h5",
          by_hash + "/refused.log");
  EXPECT_EQ(WEXITSTATUS(rrc), 2) << refused;
  EXPECT_NE(refused.find("base_hash is"), std::string::npos) << refused;
}

// The metrics count the tokens the model ran: each micro-batch of one row trimmed to its
// last scored label, so a step is the sum of those widths, read here from data.h5's labels.
TEST(LlamaData, MetricsCountTheTrimmedTokens) {
  const Case& c = kCases[0];
  const Data d = read_data(c.dir);
  int64_t per_step = 0;
  for (int64_t i = 0; i < d.n; ++i) {
    int64_t width = 1;
    for (int64_t t = 0; t < d.S; ++t)
      if (d.labels[i * d.S + t] != kqlora::kIgnoreLabel) width = t + 1;
    per_step += width;
  }
  EXPECT_LT(per_step, d.n * d.S);  // (some row is padded: trimming shows)
  const std::string run = run_train(c, "_tokens", "micro_bs=1");
  std::ifstream f(run + "/metrics.jsonl");
  std::string last;
  for (std::string line; std::getline(f, line);)
    if (line.find("\"tokens\": ") != std::string::npos) last = line;
  ASSERT_FALSE(last.empty()) << read_text(run + "/log");
  const double tokens = std::stod(last.substr(last.find("\"tokens\": ") + 10));
  EXPECT_EQ(tokens, 5.0 * per_step) << last;
  EXPECT_NE(last.find("\"model_flops\": "), std::string::npos) << last;
  const auto at = last.find("\"mfu\": ");
  ASSERT_NE(at, std::string::npos) << last;
  const double mfu = std::stod(last.substr(at + 7));
  EXPECT_GT(mfu, 0.0);
  EXPECT_LT(mfu, 1.0);
  EXPECT_NE(read_text(run + "/log").find("tokens/s"), std::string::npos);
}

// The memory estimate's activation part (nn/model_registry.cpp) counts what a forward and
// backward allocates: at most the estimate, and what keeping the activations in bfloat16
// saves, predicted from the buffer table, is the saving the tracked allocations show, with
// and without activation checkpointing. On 6-layer copies of a Llama and a Phi-3 case
// (random weights): at the cases' two layers the 16 bits the layers save are exactly what
// the one float32 block costs.
TEST(LlamaMemory, ActivationEstimateCountsTheBfloat16Saving) {
  kqlora::track_kokkos_allocations();
  const auto& kind = kqlora::model_kind("causal_lm");
  bool warm = false;
  for (const Case& c : {kCases[0], family_cases()[4]}) {
    ASSERT_TRUE(c.name == "gqa" || c.name == "phi3") << c.name;
    const Data data = read_data(c.dir);
    auto base = config_of(c, kqlora::DType::bfloat16);
    const auto at = base.arch_text.find("\"num_hidden_layers\"");
    const auto colon = base.arch_text.find(':', at),
               end = base.arch_text.find_first_of(",}", colon);
    base.arch_text.replace(colon + 1, end - colon - 1, " 6");
    base.hf_model_dir = tmp_dir("memory_" + c.name);
    std::system(("rm -rf " + base.hf_model_dir + " && mkdir -p " + base.hf_model_dir).c_str());
    std::ofstream(base.hf_model_dir + "/config.json") << base.arch_text;
    std::vector<std::vector<float>> vals;
    std::vector<kqlora::safetensors::TensorToWrite> ts;
    std::mt19937 gen(3);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (const auto& e : kqlora::CausalLm<Exec>::make_table(base).entries) {
      if (e.kind == kqlora::ParamKind::trainable) continue;
      std::vector<float> v(static_cast<size_t>(e.numel()));
      for (float& x : v)
        x = e.name.find("norm") != std::string::npos ? 1.0f + normal(gen) : normal(gen);
      vals.push_back(std::move(v));
      ts.push_back({e.name, "F32", e.shape, vals.back().data(), vals.back().size() * 4});
    }
    kqlora::safetensors::write(base.hf_model_dir + "/model.safetensors", ts);
    for (bool recompute : {false, true}) {
      int64_t grown[2] = {0, 0}, estimate[2] = {0, 0};
      for (int kept16 = 0; kept16 < 2; ++kept16) {
        auto cfg = base;
        cfg.activation_checkpointing = recompute;
        cfg.activation_dtype =
            kept16 ? kqlora::ActivationDtype::bfloat16 : kqlora::ActivationDtype::float32;
        std::ostringstream log;
        if (!warm) {  // (the first pass of a process also allocates Kokkos's team scratch)
          kqlora::CausalLm<Exec> first(Exec(), cfg);
          kqlora::initialize_model(Exec(), first, "", log);
          first.forward_backward(data.batch, data.count, false);
          warm = true;
        }
        kqlora::CausalLm<Exec> fresh(Exec(), cfg);
        kqlora::initialize_model(Exec(), fresh, "", log);
        kqlora::reset_tracked_peak();
        const int64_t before = kqlora::tracked_bytes();
        fresh.forward_backward(data.batch, data.count, false);
        grown[kept16] = kqlora::tracked_peak_bytes() - before;
        estimate[kept16] = kind.activation_bytes(cfg, data.n, data.S);
        EXPECT_LE(grown[kept16], estimate[kept16]) << c.name;
      }
      const std::string what = c.name + (recompute ? " with activation checkpointing" : "");
      EXPECT_GT(grown[0] - grown[1], 0) << what;
      EXPECT_EQ(grown[0] - grown[1], estimate[0] - estimate[1]) << what;
    }
  }
}
