// Damaged checkpoints: truncated, a flipped byte (Fletcher32), a dataset missing, a wrong
// shape, a wrong dtype, a wrong format_version. kqlora-diff exits 2 and a restart fails
// with a message naming the file and the object; nothing crashes, nothing is loaded.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/trainer.hpp"

namespace {

std::string dir() {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_damaged";
}
const std::string keys = "dim=64 num_linears=1 lora_rank=4 global_bs=2 log_every=100";

kqlora::Config deck(const std::string& extra) {
  std::vector<std::string> k;
  std::istringstream ss(keys + " " + extra);
  for (std::string w; ss >> w;) k.push_back(w);
  return kqlora::parse_deck_text("", "test", k, 1);
}

int diff(const std::string& a, const std::string& b, std::string* out) {
  const std::string log = dir() + "/diff.log";
  const int rc = std::system(
      (std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-diff " + a + " " + b + " > " + log + " 2>&1")
          .c_str());
  std::ifstream f(log);
  out->assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A copy of the good checkpoint file, changed by `damage` through the HDF5 API.
std::string damaged(const std::string& name, const std::function<void(hid_t)>& damage) {
  const std::string good = dir() + "/good/step-00000001/rank-00000.h5";
  const std::string path = dir() + "/" + name + ".h5";
  std::system(("cp " + good + " " + path).c_str());
  if (damage) {
    auto f = kqlora::h5::open_file(path, true);
    damage(f);
    f.close();
  }
  return path;
}

void expect_refused(const std::string& path, const std::string& object) {
  std::string out;
  EXPECT_EQ(diff(dir() + "/good", path, &out), 2) << out;
  EXPECT_NE(out.find(path), std::string::npos) << out;
  EXPECT_NE(out.find(object), std::string::npos) << out;
  try {
    std::ostringstream log;
    kqlora::train(deck("num_steps=2 restart=" + path + " save_dir=" + dir() + "/never"), log);
    ADD_FAILURE() << "restart from " << path << " was accepted";
  } catch (const kqlora::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(object), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::ifstream(dir() + "/never/latest").good());
}

}  // namespace

TEST(Damaged, EveryKindIsRefusedWithFileAndObject) {
  std::system(("rm -rf " + dir() + " && mkdir -p " + dir()).c_str());
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 save_dir=" + dir() + "/good"), log);

  {  // truncated: the end of the file cut off
    const std::string path = damaged("truncated", {});
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size() / 2);
    std::string out;
    EXPECT_EQ(diff(dir() + "/good", path, &out), 2) << out;
    EXPECT_NE(out.find(path), std::string::npos) << out;
    std::ostringstream l;
    EXPECT_THROW(
        kqlora::train(deck("num_steps=2 restart=" + path + " save_dir=" + dir() + "/never"), l),
        kqlora::Error);
  }
  {  // a flipped bit inside lora_a's data: the Fletcher32 checksum catches it
    const std::string path = damaged("flipped", {});
    auto c = kqlora::read_checkpoint_file(path);
    const float v = c.params[0].data[10];
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto pos = bytes.find(std::string(reinterpret_cast<const char*>(&v), 4));
    ASSERT_NE(pos, std::string::npos);
    f.seekp(static_cast<std::streamoff>(pos));
    const char x = static_cast<char>(bytes[pos] ^ 0x04);
    f.write(&x, 1);
    f.close();
    expect_refused(path, "lora_a.weight");
  }
  expect_refused(damaged("missing",
                         [](hid_t f) {
                           KQLORA_H5(H5Ldelete(f, "params/layers.0.lora_b.weight", H5P_DEFAULT));
                         }),
                 "layers.0.lora_b.weight");
  expect_refused(
      damaged("shape",
              [](hid_t f) {
                KQLORA_H5(H5Ldelete(f, "params/layers.0.lora_a.weight", H5P_DEFAULT));
                std::vector<float> v(3 * 64, 0.5f);
                kqlora::h5::write_float(f, "params/layers.0.lora_a.weight", {3, 64}, v.data());
              }),
      "lora_a.weight");
  expect_refused(damaged("dtype",
                         [](hid_t f) {
                           KQLORA_H5(H5Ldelete(f, "params/layers.0.lora_a.weight", H5P_DEFAULT));
                           std::vector<int64_t> v(4 * 64, 1);
                           kqlora::h5::write_dataset(f, "params/layers.0.lora_a.weight",
                                                     H5T_STD_I64LE, H5T_NATIVE_INT64, {4, 64},
                                                     v.data());
                         }),
                 "lora_a.weight");
  expect_refused(
      damaged("nf4_dtype",
              [](hid_t f) {
                KQLORA_H5(H5Ldelete(f, "params/layers.0.weight/quantization_factor", H5P_DEFAULT));
                std::vector<double> v(16, 1.0);
                kqlora::h5::write_dataset(f, "params/layers.0.weight/quantization_factor",
                                          H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {16}, v.data());
              }),
      "quantization_factor");
  expect_refused(damaged("version",
                         [](hid_t f) {
                           KQLORA_H5(H5Adelete(f, "format_version"));
                           kqlora::h5::write_attribute(f, "format_version", int64_t(7));
                         }),
                 "format_version 7");
}
