// Preference training against TRL 1.16 + PEFT + torchao NF4 (tools/gen_dpo_reference.py,
// tests/data/preference_reference): a Llama, a Qwen3 and a Gemma 2 with soft-caps; DPO
// (sigmoid, hinge, ipo, robust) from the init_file's adapter (TRL's frozen "ref" copy of
// it) and from a fresh one (B zero: the base), SimPO and ORPO. For each: TRL's loss and
// reward metrics on one batch of 4 pairs (1e-5), every LoRA gradient (1e-4 of the largest),
// and kqlora-train's 5 AdamW steps (the losses and the final adapters, 1e-4), as the
// SFT reference tests compare.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "h5_test_util.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/train/init.hpp"
#include "kqlora/train/preference_step.hpp"
#include "reference_case.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using kqlora_test::read_doubles;
using kqlora_test::read_text;

const std::string kData = std::string(KQLORA_TEST_DATA_DIR);

struct Variant {
  std::string model, file;  // the model's case directory, the TRL result file
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.file;
}

std::vector<Variant> variants() {
  std::vector<Variant> out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gqa", kData + "/llama_reference/gqa"},
      {"qwen3", kData + "/family_reference/qwen3"},
      {"gemma2", kData + "/family_reference/gemma2"}};
  for (const auto& [name, dir] : cases)
    for (const char* v :
         {"dpo_sigmoid_adapter", "dpo_sigmoid_fresh", "dpo_hinge_adapter", "dpo_hinge_fresh",
          "dpo_ipo_adapter", "dpo_ipo_fresh", "dpo_robust_adapter", "dpo_robust_fresh",
          "simpo_adapter", "orpo_adapter"})
      out.push_back({dir, kData + "/preference_reference/" + name + "/" + v + ".h5"});
  return out;
}

double double_attribute(hid_t f, const char* name) {
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  double v = NAN;
  EXPECT_GE(a, 0) << name;
  EXPECT_GE(H5Aread(a, H5T_NATIVE_DOUBLE, &v), 0) << name;
  H5Aclose(a);
  return v;
}

struct Reference {
  kqlora::PreferenceConfig objective;
  double lr = 0, eps = 0, weight_decay = 0;
  std::string init, dir;  // the run's init_file; the result file's directory
};

Reference read_reference(const Variant& v) {
  auto f = kqlora::h5::open_file(v.file);
  Reference r;
  r.objective.objective = kqlora::h5::read_string_attribute(f, "objective", v.file);
  r.objective.loss_type = kqlora::h5::read_string_attribute(f, "loss_type", v.file);
  r.objective.beta = double_attribute(f, "beta");
  r.objective.label_smoothing = double_attribute(f, "label_smoothing");
  r.objective.simpo_gamma = double_attribute(f, "simpo_gamma");
  r.lr = double_attribute(f, "lr");
  r.eps = double_attribute(f, "eps");
  r.weight_decay = double_attribute(f, "weight_decay");
  r.dir = v.file.substr(0, v.file.rfind('/'));
  r.init = kqlora::h5::read_string_attribute(f, "start", v.file) == "adapter"
               ? v.model + "/init.h5"
               : r.dir + "/init_fresh.h5";
  return r;
}

// The pairs file whole as one batch (the test's own reading, not the trainer's).
struct Pairs {
  std::vector<int32_t> ids, labels;
  int64_t rows = 0, T = 0;
};

Pairs read_pairs(const std::string& path) {
  auto f = kqlora::h5::open_file(path);
  const auto d = kqlora::h5::dataset_dims(f, "input_ids", path);
  Pairs p;
  p.rows = d[0];
  p.T = d[1];
  p.ids.resize(static_cast<size_t>(p.rows * p.T));
  p.labels.resize(p.ids.size());
  kqlora::h5::read_dataset(f, "input_ids", H5T_NATIVE_INT32, p.rows * p.T, p.ids.data(), path);
  kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, p.rows * p.T, p.labels.data(), path);
  return p;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

class PreferenceReference : public ::testing::TestWithParam<Variant> {};

// One batch of TRL's: the loss, the metrics and every LoRA gradient.
TEST_P(PreferenceReference, OneBatchMatchesTrl) {
  const Variant& v = GetParam();
  const Reference r = read_reference(v);
  const std::string targets = "all-linear";
  kqlora::ModelConfig cfg = kqlora_test::reference_config(v.model, targets);
  kqlora::CausalLm<Exec> model(Exec(), cfg);
  std::ostringstream log;
  kqlora::initialize_model(Exec(), model, r.init, log);

  Pairs p = read_pairs(r.dir + "/pairs.h5");
  const bool orpo = r.objective.objective == "orpo";
  double chosen_tokens = 0;  // (ORPO: the chosen rows' tokens from position 1 to the last label)
  for (int64_t i = 0; i < p.rows; i += 2)
    for (int64_t t = p.T - 1; t >= 1; --t)
      if (p.labels[i * p.T + t] != kqlora::kIgnoreLabel) {
        chosen_tokens += static_cast<double>(t);
        break;
      }
  std::vector<int64_t> prompt_end;
  if (orpo) prompt_end = kqlora::score_chosen_prompts(p.ids.data(), p.labels.data(), p.rows, p.T);
  kqlora::Batch<Mem> b;
  b.tokens = kqlora::TokenMatrix<Mem>("ids", p.rows, p.T);
  b.labels = kqlora::TokenMatrix<Mem>("labels", p.rows, p.T);
  auto ht = Kokkos::create_mirror_view(b.tokens);
  auto hl = Kokkos::create_mirror_view(b.labels);
  for (int64_t i = 0; i < p.rows * p.T; ++i) {
    ht(i / p.T, i % p.T) = p.ids[i];
    hl(i / p.T, i % p.T) = p.labels[i];
  }
  Kokkos::deep_copy(b.tokens, ht);
  Kokkos::deep_copy(b.labels, hl);
  b.global_bs = p.rows;
  kqlora::Model<Exec>::Vec reference;
  if (kqlora::needs_reference(r.objective)) {
    const auto start = kqlora::starting_trainables(cfg, model.table(), r.init);
    reference = kqlora::Model<Exec>::Vec("reference", start.size());
    auto h = Kokkos::create_mirror_view(reference);
    std::copy(start.begin(), start.end(), h.data());
    Kokkos::deep_copy(reference, h);
  }
  kqlora::PreferenceSums sums;
  const double loss = kqlora::preference_micro_batch(
      model, b, orpo ? &prompt_end : nullptr, r.objective, reference,
      static_cast<double>(p.rows / 2), chosen_tokens, true, false, sums);

  auto ref = kqlora::h5::open_file(v.file);
  const double want = read_doubles(ref, "loss")[0];
  EXPECT_NEAR(loss, want, 1e-5 * std::max(1.0, std::fabs(want))) << v.file;
  const double logp_scale = std::max(1.0, std::fabs(read_doubles(ref, "metrics/logps/chosen")[0]));
  int metrics = 0;
  for (const auto& [name, value] : sums.means(r.objective)) {
    const double w = read_doubles(ref, "metrics/" + name)[0];
    EXPECT_NEAR(value, w, 1e-5 * (name == "rewards/accuracies" ? 1.0 : logp_scale))
        << v.file << ": " << name;
    ++metrics;
  }
  EXPECT_GE(metrics, 6);
  const auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.grads);
  int checked = 0;
  double largest = 0;
  for (const kqlora::ParamEntry* e : model.table().of_kind(kqlora::ParamKind::trainable))
    largest = std::max(largest, max_abs(read_doubles(ref, "grads/" + e->name)));
  ASSERT_GT(largest, 0) << v.file;
  for (const kqlora::ParamEntry* e : model.table().of_kind(kqlora::ParamKind::trainable)) {
    const auto g = read_doubles(ref, "grads/" + e->name);
    ASSERT_EQ(static_cast<int64_t>(g.size()), e->numel()) << e->name;
    double d = 0;
    for (int64_t i = 0; i < e->numel(); ++i)
      d = std::max(d, std::fabs(grads(e->offset + i) - g[i]));
    // (per tensor, against its own largest; a fresh adapter's A gradients are all 0)
    EXPECT_LE(d, 1e-4 * std::max(max_abs(g), 1e-3 * largest)) << v.file << ": " << e->name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model.table().of_kind(kqlora::ParamKind::trainable).size()));
}

// kqlora-train's 5 AdamW steps on the whole batch: TRL's losses and final adapters.
TEST_P(PreferenceReference, FiveAdamWStepsMatchTrl) {
  const Variant& v = GetParam();
  const Reference r = read_reference(v);
  const std::string name = v.file.substr(v.file.rfind("preference_reference/") + 21);
  std::string tag = name;
  std::replace(tag.begin(), tag.end(), '/', '_');
  const std::string dir = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_pref_" + tag;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "model = causal_lm\n";
  std::ostringstream cmd;
  cmd.precision(17);
  cmd << KQLORA_TEST_BIN_DIR << "/kqlora-train " << dir << "/deck.in hf_model_dir=" << v.model
      << " init_file=" << r.init << " data_file=" << r.dir << "/pairs.h5"
      << " lora_targets=all-linear lora_rank=4 lora_alpha=8 block_size=32 scaler_block_size=32"
      << " global_bs=4 micro_bs=2 num_steps=5 optimizer=adamw lr=" << r.lr << " eps=" << r.eps
      << " weight_decay=" << r.weight_decay << " objective=" << r.objective.objective
      << " beta=" << r.objective.beta;
  if (r.objective.objective == "dpo") cmd << " loss_type=" << r.objective.loss_type;
  if (r.objective.objective == "simpo") cmd << " simpo_gamma=" << r.objective.simpo_gamma;
  if (r.objective.label_smoothing > 0) cmd << " label_smoothing=" << r.objective.label_smoothing;
  cmd << " save_dir=" << dir << "/ckpt metrics_file=" << dir << "/metrics.jsonl > " << dir
      << "/log 2>&1";
  ASSERT_EQ(std::system(cmd.str().c_str()), 0) << cmd.str() << "\n" << read_text(dir + "/log");

  auto ref = kqlora::h5::open_file(v.file);
  const auto want = read_doubles(ref, "losses");
  std::vector<double> got;
  std::ifstream m(dir + "/metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    const auto at = line.find("\"loss\": ");
    if (at != std::string::npos) got.push_back(std::stod(line.substr(at + 8)));
  }
  ASSERT_EQ(got.size(), want.size()) << read_text(dir + "/log");
  for (size_t s = 0; s < want.size(); ++s)
    EXPECT_NEAR(got[s], want[s], 1e-4 * std::max(1.0, std::fabs(want[s])))
        << v.file << " step " << s + 1;
  auto out = kqlora::h5::open_file(dir + "/ckpt/step-00000005/rank-00000.h5");
  auto final_ref = kqlora::h5::open_group(ref, "final");
  auto params = kqlora::h5::open_group(out, "params");
  int compared = 0;
  for (const auto& n : kqlora::h5::list_datasets(final_ref)) {
    const auto a = read_doubles(params, n), b = read_doubles(final_ref, n);
    ASSERT_EQ(a.size(), b.size()) << n;
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    // (2e-4: a fresh adapter's B starts at 0, and AdamW's steps from its near-zero gradient
    // entries magnify their last bits even at eps 1e-3; the gradients are checked at 1e-4)
    EXPECT_LE(d, 2e-4 * max_abs(b)) << v.file << ": " << n;
    ++compared;
  }
  EXPECT_GE(compared, 14);
}

INSTANTIATE_TEST_SUITE_P(Trl, PreferenceReference, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           std::string s =
                               i.param.file.substr(i.param.file.rfind("reference/") + 10);
                           s = s.substr(0, s.size() - 3);
                           std::replace(s.begin(), s.end(), '/', '_');
                           return s;
                         });

// Data files that cannot train the objective exit 2 naming the file and what is wrong
// (docs/TRAINING.md, "Preference training"; docs/MODELS.md, "Data files").
TEST(PreferenceData, BadFilesExitTwoNamingTheFile) {
  const std::string dir = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_pref_bad";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "model = causal_lm\n";
  const std::string model = kData + "/llama_reference/gqa";
  const std::string pairs = kData + "/preference_reference/gqa/pairs.h5";
  // A copy of the pairs file, changed by `edit` (on the open file).
  auto variant = [&](const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string path = dir + "/" + name + ".h5";
    std::system(("cp " + pairs + " " + path).c_str());
    auto f = kqlora::h5::open_file(path, true);
    edit(f);
    return path;
  };
  auto run = [&](const std::string& data, const std::string& objective,
                 const std::vector<std::string>& needles) {
    const std::string cmd = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-train " + dir +
                            "/deck.in hf_model_dir=" + model + " data_file=" + data +
                            " global_bs=2 num_steps=1 objective=" + objective + " save_dir=" + dir +
                            "/ckpt > " + dir + "/log 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << cmd << "\n" << read_text(dir + "/log");
    const std::string log = read_text(dir + "/log");
    for (const auto& n : needles) EXPECT_NE(log.find(n), std::string::npos) << n << "\n" << log;
  };
  // pairs to sft, and SFT rows (no form) to dpo
  run(pairs, "sft", {pairs, "preference pairs (form \"pairs\"), but objective = sft"});
  const std::string sft = variant("sft_rows", [](hid_t f) { H5Adelete(f, "form"); });
  run(sft, "dpo", {sft, "SFT rows, but objective = dpo needs preference pairs"});
  // KTO's unpaired rows: not read yet
  const std::string unpaired = variant("unpaired", [](hid_t f) {
    H5Adelete(f, "form");
    kqlora::h5::write_attribute(f, "form", std::string("unpaired"));
  });
  run(unpaired, "dpo", {unpaired, "attribute form = \"unpaired\" is not a form kqlora reads"});
  // a pair whose rejected row scores nothing
  const std::string empty = variant("empty_side", [](hid_t f) {
    const auto d = kqlora::h5::dataset_dims(f, "labels", "labels");
    std::vector<int32_t> labels(static_cast<size_t>(d[0] * d[1]));
    kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, d[0] * d[1], labels.data(), "labels");
    std::fill(labels.begin() + 3 * d[1], labels.begin() + 4 * d[1], kqlora::kIgnoreLabel);
    const hid_t ds = H5Dopen2(f, "labels", H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
    H5Dclose(ds);
  });
  run(empty, "dpo", {empty, "pair 1's rejected row (row 3) scores nothing"});
}

// precompute_ref_log_probs: the reference's log-probabilities computed once before the
// first step give the run the on-the-fly reference gives (losses, eval losses and metrics,
// bit for bit here); the side file is read back by a run on the same data, base and
// starting adapters, and not by one from other adapters (another key).
TEST(PreferenceData, PrecomputedReferenceGivesTheSameRun) {
  const std::string dir = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_pref_precompute";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/deck.in") << "model = causal_lm\n";
  const std::string model = kData + "/llama_reference/gqa";
  const std::string pairs = kData + "/preference_reference/gqa/pairs.h5";
  auto run = [&](const std::string& name, const std::string& extra) {
    const std::string cmd =
        std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-train " + dir +
        "/deck.in hf_model_dir=" + model + " init_file=" + model + "/init.h5 data_file=" + pairs +
        " eval_file=" + pairs +
        " eval_every=2 lora_rank=4 lora_alpha=8 block_size=32 scaler_block_size=32 global_bs=4 "
        "micro_bs=2 num_steps=4 optimizer=adamw lr=1e-2 eps=1e-3 objective=dpo save_dir=" +
        dir + "/" + name + " metrics_file=" + dir + "/" + name + ".jsonl " + extra + " > " + dir +
        "/" + name + ".log 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_text(dir + "/" + name + ".log");
    return read_text(dir + "/" + name + ".log");
  };
  // (the metrics lines without their times)
  auto numbers = [&](const std::string& name) {
    std::ifstream f(dir + "/" + name + ".jsonl");
    std::string out;
    for (std::string line; std::getline(f, line);) {
      if (line.find("\"step\"") == std::string::npos) continue;
      std::istringstream fields(line);
      for (std::string field; std::getline(fields, field, ',');)
        if (field.find("elapsed") == std::string::npos && field.find("mfu") == std::string::npos)
          out += field + ",";
      out += "\n";
    }
    return out;
  };
  run("fly", "");
  const std::string first = run("pre", "precompute_ref_log_probs=true");
  EXPECT_NE(first.find("reference: data_file's 4 pairs' log-probabilities precomputed"),
            std::string::npos)
      << first;
  EXPECT_EQ(numbers("pre"), numbers("fly"));
  EXPECT_NE(numbers("fly").find("\"eval_rewards/margins\""), std::string::npos);
  // a later run over the same save_dir reads the side file; other adapters do not
  std::system(("cp " + dir + "/pre/reference_logps_* " + dir + "/fly/").c_str());
  const std::string again =
      run("fly", "precompute_ref_log_probs=true metrics_file=" + dir + "/again.jsonl");
  EXPECT_NE(again.find("reference: data_file's 4 pairs' log-probabilities read in"),
            std::string::npos)
      << again;
  EXPECT_EQ(numbers("again"), numbers("fly"));
  const std::string other = run("fly", "precompute_ref_log_probs=true init_file=" + kData +
                                           "/preference_reference/gqa/init_fresh.h5");
  EXPECT_NE(other.find("log-probabilities precomputed"), std::string::npos) << other;
}
