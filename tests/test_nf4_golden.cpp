// NF4 against torchao's own outputs (tools/gen_nf4_golden.py, torch.set_num_threads(1)):
// quantized_data byte for byte; scaler_mean to within the rounding of a different summation
// order, and scalers/factors identical whenever the mean is; dequantization of torchao's
// components bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "exec_spaces.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;
using kqlora::bfloat16;

namespace {

struct Case {
  std::string name, dtype;
  int64_t rows = 0, cols = 0, bs = 0, sbs = 0;
  kqlora::Nf4Layout layout() const {
    kqlora::Nf4Layout L;
    L.shape = cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    L.dtype = dtype == "float32" ? kqlora::DType::float32 : kqlora::DType::bfloat16;
    L.block_size = bs;
    L.scaler_block_size = sbs;
    return L;
  }
};

std::string dir() {
  return std::string(KQLORA_TEST_DATA_DIR) + "/nf4_golden/";
}

std::vector<Case> read_manifest() {
  std::ifstream f(dir() + "manifest.txt");
  std::vector<Case> cases;
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Case c;
    ss >> c.name >> c.dtype >> c.rows >> c.cols >> c.bs >> c.sbs;
    cases.push_back(c);
  }
  return cases;
}

template <class T>
std::vector<T> read_bin(const std::string& c, const std::string& part, size_t n) {
  std::ifstream f(dir() + c + "/" + part + ".bin", std::ios::binary);
  EXPECT_TRUE(f.good()) << c << "/" << part;
  std::vector<T> v(n);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * sizeof(T)) << c << "/" << part;
  return v;
}

// Values of the dtype stored in golden files, widened to float.
std::vector<float> read_dtype(const Case& c, const std::string& part, size_t n) {
  if (c.dtype == "float32") return read_bin<float>(c.name, part, n);
  std::vector<float> out;
  for (uint16_t b : read_bin<uint16_t>(c.name, part, n))
    out.push_back(static_cast<float>(bfloat16::from_bits(b)));
  return out;
}

HostNf4 golden_tensor(const Case& c) {
  const auto L = c.layout();
  auto t = HostNf4::allocate(L);
  auto d = read_bin<uint8_t>(c.name, "quantized_data", L.num_bytes());
  auto s = read_bin<int8_t>(c.name, "quantized_scalers", L.num_blocks());
  auto f = read_dtype(c, "quantization_factor", L.num_scaler_blocks());
  std::memcpy(t.quantized_data.data(), d.data(), d.size());
  std::memcpy(t.quantized_scalers.data(), s.data(), s.size());
  std::memcpy(t.quantization_factor.data(), f.data(), 4 * f.size());
  t.scaler_mean = read_dtype(c, "scaler_mean", 1)[0];
  return t;
}

// Bits of a float holding a value of the case's dtype.
template <class T, class E>
void check_case(const Case& c, int* means_equal) {
  SCOPED_TRACE(c.name);
  const auto L = c.layout();
  std::vector<T> input;
  if constexpr (std::is_same<T, float>::value) {
    input = read_bin<float>(c.name, "input", L.numel());
  } else {
    for (uint16_t b : read_bin<uint16_t>(c.name, "input", L.numel()))
      input.push_back(bfloat16::from_bits(b));
  }
  const HostNf4 golden = golden_tensor(c);
  const auto golden_deq = read_dtype(c, "dequantized", L.numel());
  const HostNf4 ours = quantize<T, E>(input, L);

  // quantized_data: identical bytes.
  for (int64_t i = 0; i < L.num_bytes(); ++i)
    ASSERT_EQ(ours.quantized_data(i), golden.quantized_data(i)) << "byte " << i;

  // scaler_mean: equal up to summation-order rounding (a few units in the last place).
  const float ulp = c.dtype == "float32" ? std::ldexp(1.0f, -23) : std::ldexp(1.0f, -7);
  EXPECT_NEAR(ours.scaler_mean, golden.scaler_mean, 4 * ulp * std::fabs(golden.scaler_mean));
  const bool same_mean = bits(ours.scaler_mean) == bits(golden.scaler_mean);
  *means_equal += same_mean;
  for (int64_t g = 0; g < L.num_scaler_blocks(); ++g) {
    if (same_mean) {
      ASSERT_EQ(bits(ours.quantization_factor(g)), bits(golden.quantization_factor(g))) << g;
    } else {
      ASSERT_NEAR(ours.quantization_factor(g), golden.quantization_factor(g),
                  0.02 * std::fabs(golden.quantization_factor(g)))
          << g;
    }
  }
  for (int64_t b = 0; b < L.num_blocks(); ++b) {
    if (same_mean)
      ASSERT_EQ(ours.quantized_scalers(b), golden.quantized_scalers(b)) << b;
    else
      ASSERT_LE(std::abs(ours.quantized_scalers(b) - golden.quantized_scalers(b)), 1) << b;
  }

  // Dequantizing torchao's own components reproduces torchao's values bit for bit, on the
  // default path and on the portable body.
  const auto deq = dequantize<T, E>(golden);
  const auto deq_portable = dequantize_portable<T, T>(golden);
  const auto deq_bytes = dequantize_bytes<T, T>(golden);  // (the GPU body)
  for (int64_t i = 0; i < L.numel(); ++i) {
    ASSERT_EQ(bits(static_cast<float>(deq[i])), bits(golden_deq[i])) << "element " << i;
    ASSERT_EQ(bits(static_cast<float>(deq_portable[i])), bits(golden_deq[i])) << "element " << i;
    ASSERT_EQ(bits(static_cast<float>(deq_bytes[i])), bits(golden_deq[i])) << "element " << i;
  }
  // Our own round trip matches torchao's when the means agree.
  if (same_mean) {
    const auto ours_deq = dequantize<T, E>(ours);
    for (int64_t i = 0; i < L.numel(); ++i)
      ASSERT_EQ(bits(static_cast<float>(ours_deq[i])), bits(golden_deq[i])) << "element " << i;
  }
}

}  // namespace

template <class E>
class Nf4Golden : public ::testing::Test {};
TYPED_TEST_SUITE(Nf4Golden, kqlora_test::EnabledSpaces, kqlora_test::SpaceName);

// On every enabled execution space (the default host space takes the library's SIMD
// bodies, another host space the portable ones).
TYPED_TEST(Nf4Golden, MatchesTorchao) {
  const auto cases = read_manifest();
  ASSERT_GE(cases.size(), 12u) << "golden data missing: " << dir();
  int means_equal = 0;
  for (const auto& c : cases) {
    if (c.dtype == "float32")
      check_case<float, TypeParam>(c, &means_equal);
    else
      check_case<bfloat16, TypeParam>(c, &means_equal);
  }
  // Summation order rarely changes a rounded mean; most cases must agree exactly.
  EXPECT_GE(means_equal, static_cast<int>(cases.size()) - 2);
  std::printf("scaler_mean identical to torchao's in %d of %zu cases\n", means_equal, cases.size());
}
