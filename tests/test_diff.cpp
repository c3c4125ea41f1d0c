// kqlora-diff: equal checkpoints pass, a float beyond tolerance or one NF4 byte fails,
// missing and damaged files are errors (exit 2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "kqlora/core/content_hash.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/checkpoint_diff.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;

namespace {

std::string dir() {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_diff";
}

kqlora::CheckpointContents contents() {
  kqlora::CheckpointContents c;
  c.step = 3;
  c.config_text = "dim = 64\nlora_rank = 4\n";
  c.seed = 42;  // the config's (default) seed: the reader checks /rng/seed against it
  kqlora::Nf4Layout L;
  L.shape = {64, 64};
  c.nf4.emplace_back("layers.0.weight", quantize(randn(4096, 1), L));
  c.params.push_back({"layers.0.lora_a.weight", {4, 64}, randn(256, 2)});
  c.params.push_back({"layers.0.lora_b.weight", {64, 4}, randn(256, 3)});
  c.optimizer_steps = 3;
  c.optimizer.push_back({{"layers.0.lora_a.weight", "exp_avg"}, randn(256, 4)});
  return c;
}

int diff(const std::string& args, std::string* out = nullptr) {
  const std::string log = dir() + "/log";
  const int rc = std::system(
      (std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-diff " + args + " > " + log + " 2>&1").c_str());
  if (out) {
    std::ifstream f(log);
    out->assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST(Diff, VerdictsAndExitCodes) {
  std::system(("rm -rf " + dir() + " && mkdir -p " + dir() + "/a/step-00000003").c_str());
  const auto ref = contents();
  kqlora::write_checkpoint_file(dir() + "/ref.h5", ref);
  kqlora::write_checkpoint_file(dir() + "/same.h5", ref);
  kqlora::write_checkpoint_file(dir() + "/a/step-00000003/rank-00000.h5", ref);
  std::ofstream(dir() + "/a/latest") << "step-00000003\n";

  auto close = ref;
  close.params[0].data[5] += 1e-5f;  // within atol 1e-4
  kqlora::write_checkpoint_file(dir() + "/close.h5", close);
  auto far = ref;
  far.params[1].data[7] += 1e-2f;
  kqlora::write_checkpoint_file(dir() + "/far.h5", far);
  auto byte = ref;  // a deep copy of the NF4 views (the struct copy shares them)
  byte.nf4[0].second = kqlora::nf4_copy_to<Kokkos::HostSpace>(ref.nf4[0].second);
  byte.nf4[0].second.quantized_data(17) ^= 0x01;
  kqlora::write_checkpoint_file(dir() + "/byte.h5", byte);
  auto opt = ref;
  opt.optimizer[0].second[0] += 1.0f;
  kqlora::write_checkpoint_file(dir() + "/opt.h5", opt);

  std::string out;
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/same.h5 " + dir() + "/a", &out), 0) << out;
  EXPECT_NE(out.find("Passed!"), std::string::npos);
  EXPECT_NE(out.find("\u2713 layers.0.weight"), std::string::npos) << out;
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/close.h5"), 0);
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/close.h5 --atol 0 --rtol 1e-9"), 1);
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/far.h5", &out), 1);
  EXPECT_NE(out.find("\u2718 layers.0.lora_b.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("Failed!"), std::string::npos);
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/byte.h5", &out), 1);
  EXPECT_NE(out.find("quantized_data"), std::string::npos) << out;
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/opt.h5"), 0);  // optimizer state only on request
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/opt.h5 --optimizer", &out), 1);
  EXPECT_NE(out.find("optimizer/layers.0.lora_a.weight/exp_avg"), std::string::npos) << out;

  // Errors: a missing file, a truncated one, not a checkpoint, bad options.
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/none.h5"), 2);
  std::system(("head -c 3000 " + dir() + "/ref.h5 > " + dir() + "/cut.h5").c_str());
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/cut.h5", &out), 2) << out;
  std::ofstream(dir() + "/text.h5") << "not hdf5";
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/text.h5"), 2);
  EXPECT_EQ(diff(dir() + "/ref.h5"), 2);
  EXPECT_EQ(diff(dir() + "/ref.h5 " + dir() + "/same.h5 --rtol x"), 2);
}

TEST(Diff, LibraryComparesNanAsAsked) {
  auto a = contents(), b = contents();
  a.params[0].data[0] = NAN;
  b.params[0].data[0] = NAN;
  kqlora::DiffOptions o;
  auto lines = kqlora::diff_checkpoints(a, b, o);
  EXPECT_FALSE(lines[1].equal);
  o.equal_nan = true;
  lines = kqlora::diff_checkpoints(a, b, o);
  EXPECT_TRUE(lines[1].equal);
}

// kqlora-diff compares bases by hash (docs/CHECKPOINTS.md): a hash fed in pieces (a compact
// tensor widened a slab at a time) equals the hash of the same bytes added whole, and any
// changed byte or split length changes it.
TEST(Diff, ContentHashInPiecesEqualsWhole) {
  std::vector<unsigned char> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  kqlora::ContentHash whole;
  whole.add(bytes.data(), bytes.size());
  for (size_t split : {0, 8, 64, 992}) {
    kqlora::ContentHash pieces;
    pieces.add_words(bytes.data(), split);
    pieces.add_last(bytes.data() + split, bytes.size() - split, bytes.size());
    EXPECT_EQ(pieces.hex(), whole.hex()) << split;
  }
  kqlora::ContentHash shorter, changed;
  shorter.add(bytes.data(), bytes.size() - 1);
  EXPECT_NE(shorter.hex(), whole.hex());
  bytes[500] ^= 1;
  changed.add(bytes.data(), bytes.size());
  EXPECT_NE(changed.hex(), whole.hex());
  EXPECT_THROW(whole.add_words(bytes.data(), 12), std::exception);  // (not whole words)
}
