// The GGUF writer (io/gguf_writer.hpp). Its file is read back by the gguf Python package
// in ctest gguf_reader (tests/check_gguf_writer.py: every key, tensor and byte against the
// package's own encoders); here: float16 rounding against a brute-force nearest-even
// search over every finite half, q8_0 blocks against their definition, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "kqlora/core/error.hpp"
#include "kqlora/core/float16.hpp"
#include "kqlora/io/gguf_writer.hpp"

namespace {

namespace gguf = kqlora::gguf;

const std::string tmp_root = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_gguf";

/// The nearest finite half to x (ties to the even bit pattern), by search over all of them;
/// beyond the largest by half an ulp or more: infinity.
uint16_t nearest_half(float x) {
  const double v = std::fabs(static_cast<double>(x));
  uint16_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double d =
        std::fabs(static_cast<double>(kqlora::half_to_float(static_cast<uint16_t>(h))) - v);
    if (d < best_d || (d == best_d && (h & 1u) == 0)) {
      best = static_cast<uint16_t>(h);
      best_d = d;
    }
  }
  if (v >= 65520.0) best = 0x7c00u;
  return static_cast<uint16_t>(best | (std::signbit(x) ? 0x8000u : 0u));
}

std::vector<float> sample_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g(rng);
  return v;
}

}  // namespace

TEST(Gguf, Float16IsTheNearestHalfTiesToEven) {
  std::vector<float> xs = {
      0.0f,           -0.0f,           1.0f,  -2.5f,          65504.0f,
      65519.99f,      65520.0f,        1e6f,  6.1035156e-05f, 5.9604645e-08f,
      2.9802322e-08f, 2.98023259e-08f, 1e-9f, 0.1f,           1.0009765625f + 0.00048828125f};
  for (float x : sample_values(300, 1)) xs.push_back(x * std::pow(2.0f, x * 12.0f));
  // Ties between neighbours, normal and subnormal.
  for (uint16_t h : {0x0001, 0x0002, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7bfe})
    xs.push_back(0.5f * (kqlora::half_to_float(h) + kqlora::half_to_float(h + 1)));
  for (float x : xs) EXPECT_EQ(kqlora::float_to_half(x), nearest_half(x)) << x;
  const uint16_t nan = kqlora::float_to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00u, 0x7c00u);
  EXPECT_NE(nan & 0x3ffu, 0u);
}

TEST(Gguf, Q8BlocksAreTheScaleAndTheRoundedQuotients) {
  std::vector<float> x = sample_values(96, 2);
  for (int i = 32; i < 64; ++i) x[i] = 0.0f;  // a zero block: scale 0, quotients 0
  x[64] = 127.0f;  // the third block's scale is exactly 1: quotients are round-half-away
  x[65] = 2.5f;
  x[66] = -2.5f;
  x[67] = 0.5f;
  std::vector<uint8_t> out(static_cast<size_t>(gguf::tensor_bytes(gguf::TensorType::q8_0, 96)));
  ASSERT_EQ(out.size(), 3u * 34u);
  gguf::encode(gguf::TensorType::q8_0, x.data(), 96, out.data());
  for (int b = 0; b < 3; ++b) {
    uint16_t dh;
    std::memcpy(&dh, out.data() + b * 34, 2);
    const double d = kqlora::half_to_float(dh);
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b * 32 + i])));
    EXPECT_NEAR(d, amax / 127, amax / 127 * 1e-3) << "block " << b;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int8_t>(out[b * 34 + 2 + i]);
      if (amax == 0) {
        EXPECT_EQ(q, 0);
        continue;
      }
      EXPECT_LE(std::fabs(q - x[b * 32 + i] * 127 / amax), 0.5 + 1e-4) << b << ", " << i;
    }
  }
  EXPECT_EQ(static_cast<int8_t>(out[2 * 34 + 2 + 1]), 3);   // 2.5 -> 3
  EXPECT_EQ(static_cast<int8_t>(out[2 * 34 + 2 + 2]), -3);  // -2.5 -> -3
  EXPECT_EQ(static_cast<int8_t>(out[2 * 34 + 2 + 3]), 1);   // 0.5 -> 1
  EXPECT_THROW(gguf::tensor_bytes(gguf::TensorType::q8_0, 33), kqlora::Error);
  x[70] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(gguf::encode(gguf::TensorType::q8_0, x.data(), 96, out.data()), kqlora::InputError);
}

// The file the Python reader checks: metadata of every kind, a tensor of each type (the
// q8_0 one with a zero block), and the float32 values they were made from.
TEST(Gguf, WritesTheFileTheGgufPackageReads) {
  std::system(("rm -rf " + tmp_root + " && mkdir -p " + tmp_root).c_str());
  gguf::Writer w;
  w.add("general.architecture", "llama");
  w.add("general.name", "kqlora test");
  w.add_u32("llama.block_count", 2);
  w.add_i32("test.i32", -7);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_strings("tokenizer.ggml.tokens", {"<s>", "hello", "w\xc3\xb6rld", ""});
  w.add_i32s("tokenizer.ggml.token_type", {3, 1, 1, 1});
  w.add_f32s("tokenizer.ggml.scores", {0.0f, -1.5f, -2.25f, 0.0f});
  w.add_bools("gemma3.attention.sliding_window_pattern", {true, false, true});
  EXPECT_THROW(w.add_u32("llama.block_count", 3), kqlora::Error);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"t.f32", {3, 64}}, {"t.f16", {2, 64}}, {"t.bf16", {64}}, {"t.q8_0", {4, 64}}};
  const gguf::TensorType types[] = {gguf::TensorType::f32, gguf::TensorType::f16,
                                    gguf::TensorType::bf16, gguf::TensorType::q8_0};
  for (size_t i = 0; i < shapes.size(); ++i)
    w.add_tensor(shapes[i].first, shapes[i].second, types[i]);
  EXPECT_THROW(w.add_tensor("t.bad", {3, 48}, gguf::TensorType::q8_0), kqlora::Error);
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i].second) n *= d;
    values.push_back(sample_values(n, 10 + static_cast<uint32_t>(i)));
  }
  for (int i = 64; i < 96; ++i) values[3][i] = 0.0f;
  values[1][5] = 1e6f;  // float16: infinity
  w.write(tmp_root + "/writer.gguf", [&](size_t i, std::vector<float>& out) { out = values[i]; });
  std::ofstream raw(tmp_root + "/values.f32", std::ios::binary);
  for (const auto& v : values)
    raw.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(4 * v.size()));
  ASSERT_TRUE(raw.good());
  std::ifstream check(tmp_root + "/writer.gguf", std::ios::binary);
  char magic[4];
  check.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "GGUF");
  std::ifstream no_tmp(tmp_root + "/writer.gguf.tmp");
  EXPECT_FALSE(no_tmp.good());
}

TEST(Gguf, AFailedWriteLeavesNoFile) {
  std::system(("mkdir -p " + tmp_root).c_str());
  gguf::Writer w;
  w.add_tensor("t", {32}, gguf::TensorType::f32);
  const std::string path = tmp_root + "/failed.gguf";
  EXPECT_THROW(w.write(path, [](size_t, std::vector<float>& out) { out.resize(5); }),
               kqlora::Error);
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  EXPECT_THROW(w.write(tmp_root + "/no/such/dir/x.gguf", [](size_t, std::vector<float>&) {}),
               kqlora::InputError);
  EXPECT_THROW(gguf::tensor_type_from_name("q4_k", "--gguf-type"), kqlora::InputError);
}
