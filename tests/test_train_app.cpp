// kqlora-train and kqlora-export end to end: non-finite steps (stop and skip), evaluation,
// initialisation from safetensors, periodic checkpoints with keep_last, merged export.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "kqlora/core/json.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/io/safetensors.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;

namespace {

const std::string bin_dir = KQLORA_TEST_BIN_DIR;
std::string dir() {
  return bin_dir + "/../tests/tmp_app";
}

int run(const std::string& cmd, std::string* out = nullptr) {
  const std::string log = dir() + "/log";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  if (out) {
    std::ifstream f(log);
    out->assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

const std::string deck_keys =
    " dim=32 num_linears=2 lora_rank=4 global_bs=4 loss=mse optimizer=adam lr=1e-2 seed=5";

std::string train(const std::string& extra) {
  return bin_dir + "/kqlora-train " + dir() + "/empty.in" + deck_keys + " " + extra;
}

void write_data(const std::string& path, int rows, int bad_row) {
  auto x = randn(rows * 32, 11), t = randn(rows * 32, 12);
  if (bad_row >= 0) x[bad_row * 32 + 3] = NAN;
  auto f = kqlora::h5::create_file(path);
  kqlora::h5::write_float(f, "inputs", {rows, 32}, x.data());
  kqlora::h5::write_float(f, "targets", {rows, 32}, t.data());
  f.close();
}

std::vector<kqlora::CheckpointTensor> params_of(const std::string& path) {
  return kqlora::read_checkpoint_file(kqlora::checkpoint_files(path).front()).params;
}

class TrainRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    std::system(("rm -rf " + dir() + " && mkdir -p " + dir()).c_str());
    std::ofstream(dir() + "/empty.in") << "# all keys on the command line\n";
  }
};

}  // namespace

TEST_F(TrainRuns, NonFiniteLossStopsOrSkipsWithoutUpdating) {
  write_data(dir() + "/nan.h5", 8, 5);  // step 2 (rows 4..7) has a NaN input
  std::string out;
  EXPECT_EQ(
      run(train("num_steps=2 data_file=" + dir() + "/nan.h5 save_dir=" + dir() + "/stop"), &out),
      1);
  EXPECT_NE(out.find("step 2: the loss is not finite"), std::string::npos) << out;
  EXPECT_FALSE(std::ifstream(dir() + "/stop/latest").good());  // nothing saved from it

  EXPECT_EQ(run(train("num_steps=2 nonfinite=skip data_file=" + dir() +
                      "/nan.h5 save_dir=" + dir() + "/skip metrics_file=" + dir() + "/skip.jsonl"),
                &out),
            0)
      << out;
  EXPECT_EQ(run(train("num_steps=1 data_file=" + dir() + "/nan.h5 save_dir=" + dir() + "/one")), 0);
  const auto skipped = params_of(dir() + "/skip"), one = params_of(dir() + "/one");
  ASSERT_EQ(skipped.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(skipped[i].data, one[i].data) << one[i].name;
  const auto ck =
      kqlora::read_checkpoint_file(kqlora::checkpoint_files(dir() + "/skip").front(), true);
  EXPECT_EQ(ck.optimizer_steps, 1);
  std::ifstream m(dir() + "/skip.jsonl");
  std::string l1, l2;
  std::getline(m, l1);
  std::getline(m, l2);
  EXPECT_FALSE(kqlora::json::parse(l1, "m").find("skipped")->boolean);
  EXPECT_TRUE(kqlora::json::parse(l2, "m").find("skipped")->boolean);
}

TEST_F(TrainRuns, EvaluationCheckpointsAndKeepLast) {
  write_data(dir() + "/data.h5", 12, -1);
  write_data(dir() + "/eval.h5", 4, -1);
  std::string out;
  ASSERT_EQ(run(train("num_steps=6 data_file=" + dir() + "/data.h5 eval_file=" + dir() +
                      "/eval.h5 eval_every=2 checkpoint_every=2 keep_last=2 save_dir=" + dir() +
                      "/ck metrics_file=" + dir() + "/m.jsonl"),
                &out),
            0)
      << out;
  // Steps 2, 4, 6 were saved; keep_last = 2 left 4 and 6.
  EXPECT_FALSE(std::ifstream(dir() + "/ck/step-00000002/rank-00000.h5").good());
  EXPECT_TRUE(std::ifstream(dir() + "/ck/step-00000004/rank-00000.h5").good());
  EXPECT_TRUE(std::ifstream(dir() + "/ck/step-00000006/rank-00000.h5").good());
  std::ifstream latest(dir() + "/ck/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-00000006");
  // Eval lines every 2 steps, each a finite mse over the eval rows.
  std::ifstream m(dir() + "/m.jsonl");
  int evals = 0;
  for (std::string line; std::getline(m, line);) {
    const auto v = kqlora::json::parse(line, "m");
    if (const auto* e = v.find("eval_loss")) {
      ++evals;
      EXPECT_TRUE(std::isfinite(e->number) && e->number > 0);
    }
  }
  EXPECT_EQ(evals, 3);
  EXPECT_NE(out.find("eval "), std::string::npos);
}

TEST_F(TrainRuns, InitFromSafetensorsAndMergedExport) {
  // A safetensors init_file with float base weights and adapters: step 0 is what it holds.
  const auto w0 = randn(32 * 32, 20, 0.2f), a0 = randn(4 * 32, 21, 0.1f),
             b0 = randn(32 * 4, 22, 0.1f);
  kqlora::safetensors::write(dir() + "/init.safetensors",
                             {{"layers.0.weight", "F32", {32, 32}, w0.data(), 4 * w0.size()},
                              {"layers.0.lora_a.weight", "F32", {4, 32}, a0.data(), 4 * a0.size()},
                              {"layers.0.lora_b.weight", "F32", {32, 4}, b0.data(), 4 * b0.size()},
                              {"unrelated", "F32", {4}, a0.data(), 16}});
  std::string out;
  ASSERT_EQ(
      run(train("num_steps=0 init_file=" + dir() + "/init.safetensors save_dir=" + dir() + "/init"),
          &out),
      0)
      << out;
  EXPECT_NE(out.find("3 tensors from " + dir() + "/init.safetensors"), std::string::npos) << out;
  EXPECT_NE(out.find("1 tensors of"), std::string::npos) << out;  // "unrelated" noted
  const auto c = kqlora::read_checkpoint_file(kqlora::checkpoint_files(dir() + "/init").front());
  kqlora::Nf4Layout L;
  L.shape = {32, 32};
  const auto expected = quantize(w0, L);
  ASSERT_EQ(c.nf4[0].first, "layers.0.weight");
  EXPECT_EQ(
      0, std::memcmp(c.nf4[0].second.quantized_data.data(), expected.quantized_data.data(), 512));
  EXPECT_EQ(c.params[0].data, a0);
  EXPECT_EQ(c.params[1].data, b0);

  // Merged export: dequantized W + (alpha/rank) B A, against float64 arithmetic here.
  ASSERT_EQ(run(bin_dir + "/kqlora-export " + dir() + "/init --merged " + dir() + "/m.safetensors"),
            0);
  const auto h = kqlora::safetensors::read_header(dir() + "/m.safetensors");
  const auto bytes = kqlora::safetensors::read_bytes(h, *h.find("layers.0.weight"));
  std::vector<float> merged(32 * 32);
  std::memcpy(merged.data(), bytes.data(), bytes.size());
  const auto wd = dequantize<float>(expected);
  const double s = 16.0 / 4;  // lora_alpha 16 (default) / rank 4
  for (int o = 0; o < 32; ++o)
    for (int i = 0; i < 32; ++i) {
      double ref = wd[o * 32 + i];
      for (int k = 0; k < 4; ++k) ref += s * b0[o * 4 + k] * static_cast<double>(a0[k * 32 + i]);
      ASSERT_NEAR(merged[o * 32 + i], ref, 1e-6) << o << "," << i;
    }
  ASSERT_EQ(run(bin_dir + "/kqlora-export " + dir() + "/init --peft " + dir() + "/peft"), 0);
  const auto ph = kqlora::safetensors::read_header(dir() + "/peft/adapter_model.safetensors");
  EXPECT_TRUE(ph.find("base_model.model.layers.0.lora_A.weight"));
  EXPECT_TRUE(ph.find("base_model.model.layers.1.lora_B.weight"));
  std::ifstream cfg(dir() + "/peft/adapter_config.json");
  const std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  const auto js = kqlora::json::parse(text, "adapter_config.json");
  EXPECT_EQ(js.find("peft_type")->string, "LORA");
  EXPECT_EQ(js.find("r")->integer, 4);
  EXPECT_EQ(js.find("bias")->string, "none");
  EXPECT_EQ(run(bin_dir + "/kqlora-export " + dir() + "/init"), 2);  // neither --merged nor --peft

  // No export writes over its inputs (exit 2): the checkpoint file, anything in its step
  // directory, the save_dir and its latest; both files stay byte for byte.
  const std::string file = kqlora::checkpoint_files(dir() + "/init").front();
  const std::string step = file.substr(0, file.rfind('/'));
  auto bytes_of = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string file_before = bytes_of(file), latest_before = bytes_of(dir() + "/init/latest");
  ASSERT_FALSE(file_before.empty());
  ASSERT_FALSE(latest_before.empty());
  for (const std::string& o :
       {"--gguf " + file, "--merged " + file, "--merged " + step + "/m.safetensors",
        "--peft " + step, "--peft " + step + "/", "--base " + dir() + "/init/latest",
        "--merged " + dir() + "/init",
        "--gguf " + dir() + "/../" + dir().substr(dir().rfind('/') + 1) + "/init/latest"}) {
    std::string log;
    EXPECT_EQ(run(bin_dir + "/kqlora-export " + dir() + "/init " + o, &log), 2) << o << "\n" << log;
    EXPECT_NE(log.find("checkpoint"), std::string::npos) << o << "\n" << log;
  }
  EXPECT_EQ(bytes_of(file), file_before);
  EXPECT_EQ(bytes_of(dir() + "/init/latest"), latest_before);
  // Beside the save_dir is fine.
  EXPECT_EQ(
      run(bin_dir + "/kqlora-export " + dir() + "/init --merged " + dir() + "/m2.safetensors"), 0);
}
