// Packed rows (a token file with position_ids; docs/MODELS.md, "Data files") against the
// same examples one a row. The reference is transformers + PEFT on each example alone
// (tests/data/*_reference, tools/gen_llama_reference.py): packing must change nothing an
// example computes, for every family (windows, soft-caps, per-layer and partial ropes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "h5_test_util.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/nn/causal_lm.hpp"
#include "kqlora/train/data.hpp"
#include "kqlora/train/init.hpp"
#include "mpi_launcher.hpp"
#include "reference_case.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using kqlora_test::read_doubles;

const std::string data_root = KQLORA_TEST_DATA_DIR;
const std::string train_bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-train";
const std::string diff_bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-diff";

using kqlora_test::max_abs;
using kqlora_test::read_text;

std::string tmp_dir(const std::string& name) {
  const std::string dir = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_packing_" + name;
  EXPECT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  return dir;
}

struct Case {
  std::string name, dir, targets = "all-linear";
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::vector<Case> all_cases() {
  std::vector<Case> v = {{"gqa", data_root + "/llama_reference/gqa"},
                         {"llama3_qv", data_root + "/llama_reference/llama3_qv", "q_proj,v_proj"},
                         {"mistral", data_root + "/llama_reference/mistral"}};
  for (const char* name :
       {"qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "phi3_long", "mistral_window",
        "qwen3_moe", "olmoe", "qwen2_moe", "gpt_oss", "smollm3", "olmo2", "olmo3", "granite",
        "qwen3_5_text", "gemma4_kv_shared", "gemma4_ple", "gemma4_moe"}) {
    Case c{name, data_root + "/family_reference/" + name};
    std::ifstream f(c.dir + "/case.txt");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("lora_targets = ", 0) == 0) c.targets = line.substr(15);
    v.push_back(c);
  }
  return v;
}

/// A case's data.h5: n rows of S, and each row's length (its last non-padded position + 1,
/// from reference.h5's `valid`).
struct Rows {
  int64_t n = 0, S = 0;
  std::vector<int32_t> ids, labels;
  std::vector<int64_t> length;
};

Rows read_rows(const Case& c) {
  auto f = kqlora::h5::open_file(c.dir + "/data.h5");
  const auto d = kqlora::h5::dataset_dims(f, "input_ids", c.dir);
  Rows r;
  r.n = d[0];
  r.S = d[1];
  r.ids.resize(static_cast<size_t>(r.n * r.S));
  r.labels.resize(r.ids.size());
  kqlora::h5::read_dataset(f, "input_ids", H5T_NATIVE_INT32, r.ids.size(), r.ids.data(), c.dir);
  kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, r.ids.size(), r.labels.data(), c.dir);
  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto valid = read_doubles(ref, "valid");
  for (int64_t i = 0; i < r.n; ++i) {
    int64_t len = 1;
    for (int64_t t = 0; t < r.S; ++t)
      if (valid[i * r.S + t] != 0) len = t + 1;
    r.length.push_back(len);
  }
  return r;
}

/// Groups of rows packed one group a row of `width` (whole examples, then padding: id 0,
/// label -100, position 0). A document's first label keeps the example's own (a real id
/// where the example is scored from its start): the trainer must ignore it.
struct Packed {
  int64_t n = 0, width = 0;
  std::vector<int32_t> ids, labels, positions;
  std::vector<std::pair<int64_t, int64_t>> origin;  // per packed token: (row, position)
};

Packed pack(const Rows& r, const std::vector<std::vector<int>>& groups, int64_t width) {
  Packed p;
  p.n = static_cast<int64_t>(groups.size());
  p.width = width;
  p.ids.assign(static_cast<size_t>(p.n * width), 0);
  p.labels.assign(p.ids.size(), kqlora::kIgnoreLabel);
  p.positions.assign(p.ids.size(), 0);
  p.origin.assign(p.ids.size(), {-1, -1});
  for (int64_t g = 0; g < p.n; ++g) {
    int64_t at = g * width;
    for (int row : groups[g]) {
      for (int64_t t = 0; t < r.length[row]; ++t, ++at) {
        EXPECT_LT(at, (g + 1) * width);
        p.ids[at] = r.ids[row * r.S + t];
        p.labels[at] = r.labels[row * r.S + t];
        p.positions[at] = static_cast<int32_t>(t);
        p.origin[at] = {row, t};
      }
    }
  }
  return p;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids,
                      const std::vector<int32_t>& labels, const std::vector<int32_t>* positions,
                      int64_t n, int64_t S) {
  auto f = kqlora::h5::create_file(path);
  kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {n, S}, ids.data());
  kqlora::h5::write_dataset(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {n, S}, labels.data());
  if (positions)
    kqlora::h5::write_dataset(f, "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {n, S},
                              positions->data());
}

kqlora::ModelConfig config_of(const Case& c) {
  return kqlora_test::reference_config(c.dir, c.targets);
}

}  // namespace

class PackedReference : public ::testing::TestWithParam<Case> {};

// Every example of the case in one packed row (in reverse order, so no example sits where
// it did), read through DataSource as the trainer reads it: each token's logits, the loss
// and every LoRA gradient are transformers + PEFT's on the examples one a row.
TEST_P(PackedReference, LogitsLossAndGradientsAreEachExamplesAlone) {
  const Case& c = GetParam();
  const Rows rows = read_rows(c);
  std::vector<int> order;
  int64_t total = 0;
  for (int64_t i = rows.n - 1; i >= 0; --i) {
    order.push_back(static_cast<int>(i));
    total += rows.length[i];
  }
  const Packed p = pack(rows, {order}, total + 3);  // (and three positions of padding)
  const std::string dir = tmp_dir(c.name);
  write_token_file(dir + "/packed.h5", p.ids, p.labels, &p.positions, 1, p.width);

  kqlora::CausalLm<Exec> model(Exec(), config_of(c));
  std::ostringstream log;
  kqlora::initialize_model(Exec(), model, c.dir + "/init.h5", log);
  kqlora::DataSource src(dir + "/packed.h5", model.input(), 1, 0, "data_file");
  ASSERT_TRUE(src.packed());
  kqlora::Batch<Mem> b;
  b.tokens = kqlora::TokenMatrix<Mem>("ids", 1, p.width);
  b.labels = kqlora::TokenMatrix<Mem>("labels", 1, p.width);
  b.positions = kqlora::TokenMatrix<Mem>("positions", 1, p.width);
  auto ht = Kokkos::create_mirror_view(b.tokens);
  auto hl = Kokkos::create_mirror_view(b.labels);
  auto hp = Kokkos::create_mirror_view(b.positions);
  src.tokens(0, 0, 1, ht.data(), hl.data(), hp.data());
  for (int64_t t = 0; t < p.width; ++t) {
    ASSERT_EQ(hp(0, t), p.positions[t]);
    if (p.positions[t] == 0) EXPECT_EQ(hl(0, t), kqlora::kIgnoreLabel) << "position " << t;
  }
  Kokkos::deep_copy(b.tokens, ht);
  Kokkos::deep_copy(b.labels, hl);
  Kokkos::deep_copy(b.positions, hp);
  b.global_bs = 1;

  auto ref = kqlora::h5::open_file(c.dir + "/reference.h5");
  const auto ref_logits = read_doubles(ref, "logits");
  const int64_t V = model.spec().vocab;
  const auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.logits(b));
  double worst = 0, scale = 0;
  int64_t compared = 0;
  for (int64_t t = 0; t < p.width; ++t) {
    const auto [row, pos] = p.origin[t];
    if (row < 0) continue;
    const double* z = ref_logits.data() + (row * rows.S + pos) * V;
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, std::fabs(logits(t, v) - z[v]));
      scale = std::max(scale, std::fabs(z[v]));
    }
    ++compared;
  }
  EXPECT_EQ(compared, total);
  EXPECT_LE(worst, 1e-5 * scale) << c.name << ": logits";

  // The scored labels are the unpacked rows' (a row's first label is never scored).
  double count = 0;
  for (int64_t t = 1; t < p.width; ++t) count += hl(0, t) != kqlora::kIgnoreLabel;
  EXPECT_EQ(count, src.normaliser(0, false));
  const double loss = model.forward_backward(b, count, false);
  const double ref_loss = read_doubles(ref, "loss")[0];
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss)) << c.name;
  const auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.grads);
  int checked = 0;
  for (const kqlora::ParamEntry* e : model.table().of_kind(kqlora::ParamKind::trainable)) {
    const auto g = read_doubles(ref, "grads/" + e->name);
    ASSERT_EQ(static_cast<int64_t>(g.size()), e->numel()) << e->name;
    double d = 0;
    for (int64_t i = 0; i < e->numel(); ++i)
      d = std::max(d, std::fabs(grads(e->offset + i) - g[i]));
    EXPECT_LE(d, 1e-4 * max_abs(g)) << c.name << ": " << e->name;
    ++checked;
  }
  // (every adapter the reference has: the projections' and the experts')
  EXPECT_EQ(checked, static_cast<int>(
                         kqlora::h5::list_datasets(kqlora::h5::open_group(ref, "grads")).size()));
  EXPECT_GE(checked, static_cast<int>(model.table().adapters.size()) * 2);
}

INSTANTIATE_TEST_SUITE_P(Families, PackedReference, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

namespace {

std::vector<double> metric_values(const std::string& metrics, const std::string& key) {
  std::ifstream f(metrics);
  std::vector<double> out;
  const std::string field = "\"" + key + "\": ";
  for (std::string line; std::getline(f, line);) {
    const auto at = line.find(field);
    if (at != std::string::npos && line.find("\"step\": ") != std::string::npos)
      out.push_back(std::stod(line.substr(at + field.size())));
  }
  return out;
}

/// kqlora-train on `data`.h5 of `dir` (6 AdamW steps), under `launcher` (empty: one
/// process) with `extra` keys; returns the run's name (its save_dir, metrics and log).
std::string train(const Case& c, const std::string& dir, const std::string& data, int64_t global_bs,
                  const std::string& name, const std::string& launcher = "",
                  const std::string& extra = "") {
  const std::string out = dir + "/" + name;
  std::ofstream(out + ".in") << "# a packed-rows test run\nmodel = causal_lm\n";
  const std::string cmd = launcher + train_bin + " " + out + ".in hf_model_dir=" + c.dir +
                          " data_file=" + dir + "/" + data + ".h5 lora_targets=" + c.targets +
                          " lora_rank=4 lora_alpha=8 block_size=32 scaler_block_size=32 "
                          "lora_dropout=0 global_bs=" +
                          std::to_string(global_bs) +
                          " micro_bs=1 num_steps=6 optimizer=adamw lr=1e-2 init_file=" + c.dir +
                          "/init.h5 save_dir=" + out + " metrics_file=" + out + ".jsonl " + extra +
                          " > " + out + ".log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << read_text(out + ".log");
  return out;
}

/// Run b against run a: the same per-step losses (rtol 1e-5) and real tokens, and the
/// adapters after the last step within rtol 1e-4 (atol 1e-6).
void expect_same_run(const std::string& a, const std::string& b) {
  const auto la = metric_values(a + ".jsonl", "loss"), lb = metric_values(b + ".jsonl", "loss");
  ASSERT_EQ(la.size(), 6u) << read_text(a + ".log");
  ASSERT_EQ(lb.size(), 6u) << read_text(b + ".log");
  for (size_t s = 0; s < la.size(); ++s)
    EXPECT_NEAR(lb[s], la[s], 1e-5 * std::fabs(la[s])) << b << " step " << s + 1;
  // Real tokens: the examples' lengths, not the packed rows' width.
  const auto ta = metric_values(a + ".jsonl", "tokens"), tb = metric_values(b + ".jsonl", "tokens");
  EXPECT_EQ(tb, ta) << b;
  // (kqlora-diff reassembles FSDP's shard files.)
  const std::string cmd =
      diff_bin + " " + a + " " + b + " --rtol 1e-4 --atol 1e-6 > " + b + ".diff 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_text(b + ".diff");
}

}  // namespace

// The same examples packed two a row (global_bs 2) and one a row (global_bs 4, the same
// examples a step): the same per-step losses and, after six AdamW steps, the same
// adapters, at one rank and packed under DDP and FSDP at two. AdamW divides each update by
// the root of its second moment, so a gradient that differs by rounding moves an adapter
// by up to lr a step where it is near zero: the adapters are compared at rtol 1e-4, which
// a wrong mask or rotary (1e-2 and more) exceeds.
TEST(PackedTraining, PackedAndUnpackedRunsGiveTheSameLossesAndAdapters) {
  const Case c = all_cases()[0];
  const Rows rows = read_rows(c);
  ASSERT_EQ(rows.n, 3);
  const std::vector<std::vector<int>> pairs = {{0, 1}, {2, 0}, {1, 2}, {2, 1}};
  const std::string dir = tmp_dir("train");
  std::vector<int32_t> ids, labels;
  for (const auto& pr : pairs)
    for (int row : pr) {
      ids.insert(ids.end(), rows.ids.begin() + row * rows.S, rows.ids.begin() + (row + 1) * rows.S);
      labels.insert(labels.end(), rows.labels.begin() + row * rows.S,
                    rows.labels.begin() + (row + 1) * rows.S);
    }
  write_token_file(dir + "/unpacked.h5", ids, labels, nullptr, 8, rows.S);
  const Packed p = pack(rows, pairs, 2 * rows.S);
  write_token_file(dir + "/packed.h5", p.ids, p.labels, &p.positions, p.n, p.width);

  const std::string one = train(c, dir, "unpacked", 4, "unpacked");
  expect_same_run(one, train(c, dir, "packed", 2, "packed"));
#ifdef KQLORA_TEST_MPIEXEC
  const std::string np2 = mpi_launcher(2);
  expect_same_run(one, train(c, dir, "packed", 2, "packed_ddp", np2));
  expect_same_run(one, train(c, dir, "packed", 2, "packed_fsdp", np2, "parallel=fsdp"));
#endif
}

// position_ids that are not runs 0, 1, 2, ... (or not input_ids' shape) are refused,
// naming the file, the row and the column.
TEST(PackedTraining, PositionsThatAreNotDocumentRunsAreRefused) {
  const std::string dir = tmp_dir("bad");
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8}, labels = ids;
  const kqlora::InputSpec spec = [] {
    kqlora::InputSpec s;
    s.tokens = true;
    s.vocab = 96;
    return s;
  }();
  struct Bad {
    std::vector<int32_t> positions;
    std::string what;
  };
  for (const Bad& bad : std::vector<Bad>{{{0, 1, 2, 4, 0, 1, 2, 3}, "position_ids[0, 3] = 4"},
                                         {{0, 1, 2, 3, 1, 2, 3, 4}, "position_ids[1, 0] = 1"},
                                         {{0, 1, 0, 1, 0, 1, 2, -1}, "position_ids[1, 3] = -1"}}) {
    write_token_file(dir + "/bad.h5", ids, labels, &bad.positions, 2, 4);
    try {
      kqlora::DataSource src(dir + "/bad.h5", spec, 1, 0, "data_file");
      ADD_FAILURE() << bad.what << ": accepted";
    } catch (const kqlora::InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir + "/bad.h5"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad.what), std::string::npos) << msg;
    }
  }
  // The shape of input_ids, or refused.
  {
    auto f = kqlora::h5::create_file(dir + "/shape.h5");
    kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {2, 4}, ids.data());
    kqlora::h5::write_dataset(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {2, 4}, labels.data());
    kqlora::h5::write_dataset(f, "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {4, 2},
                              ids.data());
  }
  try {
    kqlora::DataSource src(dir + "/shape.h5", spec, 1, 0, "data_file");
    ADD_FAILURE() << "position_ids [4, 2] accepted";
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'position_ids' must be [2, 4]"), std::string::npos)
        << e.what();
  }
}
