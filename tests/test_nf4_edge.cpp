// NF4 on what torchao refuses or gets wrong: partial scaler blocks, all-zero blocks,
// constant scalers, bad sizes; against the scalar reference of nf4_reference.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nf4_reference.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;
using kqlora::bfloat16;

namespace {

kqlora::Nf4Layout layout(std::vector<int64_t> shape, int64_t bs = 64, int64_t sbs = 256) {
  kqlora::Nf4Layout L;
  L.shape = shape;
  L.block_size = bs;
  L.scaler_block_size = sbs;
  return L;
}

template <class T>
void expect_matches_reference(const std::vector<float>& x, const kqlora::Nf4Layout& L) {
  std::vector<T> in(x.begin(), x.end());
  if constexpr (std::is_same<T, bfloat16>::value) {
    for (size_t i = 0; i < x.size(); ++i) in[i] = bfloat16(x[i]);
  }
  std::vector<float> widened(in.size());
  for (size_t i = 0; i < in.size(); ++i) widened[i] = static_cast<float>(in[i]);
  const bool bf16 = std::is_same<T, bfloat16>::value;
  const auto ref = nf4ref::quantize(widened, L.block_size, L.scaler_block_size, bf16);
  const auto t = quantize(in, L);
  ASSERT_EQ(bits(t.scaler_mean), bits(ref.mean));
  for (int64_t i = 0; i < L.num_bytes(); ++i) ASSERT_EQ(t.quantized_data(i), ref.data[i]) << i;
  for (int64_t i = 0; i < L.num_blocks(); ++i)
    ASSERT_EQ(t.quantized_scalers(i), ref.scalers[i]) << i;
  for (int64_t i = 0; i < L.num_scaler_blocks(); ++i)
    ASSERT_EQ(bits(t.quantization_factor(i)), bits(ref.factors[i])) << i;
  const auto deq = dequantize<T>(t);
  for (int64_t i = 0; i < L.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(static_cast<float>(deq[i])));
    ASSERT_EQ(bits(static_cast<float>(deq[i])), bits(ref.dequantized[i])) << i;
  }
}

}  // namespace

TEST(Nf4Edge, PartialLastScalerBlockMatchesReference) {
  // 300 blocks: one full scaler block of 256 and a partial one of 44.
  const auto L = layout({300, 64});
  const auto x = randn(L.numel(), 1);
  expect_matches_reference<float>(x, L);
  expect_matches_reference<bfloat16>(x, L);
}

TEST(Nf4Edge, AwkwardBlockSizesMatchReference) {
  for (auto [rows, cols, bs, sbs] : std::vector<std::array<int64_t, 4>>{
           {7, 18, 6, 5}, {1, 2, 2, 1}, {33, 64, 32, 7}, {5, 96, 48, 1000}, {2048, 0, 16, 3}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " bs " << bs << " sbs " << sbs);
    const auto L = cols ? layout({rows, cols}, bs, sbs) : layout({rows}, bs, sbs);
    const auto x = randn(L.numel(), 2, 3.0f);
    expect_matches_reference<float>(x, L);
    expect_matches_reference<bfloat16>(x, L);
  }
}

TEST(Nf4Edge, AllZeroBlocksDecodeToZero) {
  const auto L = layout({16, 64});
  auto x = randn(L.numel(), 3);
  for (int i = 64 * 5; i < 64 * 7; ++i) x[i] = 0.0f;  // blocks 5 and 6
  expect_matches_reference<float>(x, L);
  const auto t = quantize(x, L);
  for (int j = 32 * 5; j < 32 * 7; ++j) EXPECT_EQ(t.quantized_data(j), 0x77);
  const auto deq = dequantize<float>(t);
  for (int i = 64 * 5; i < 64 * 7; ++i) EXPECT_EQ(deq[i], 0.0f);
}

TEST(Nf4Edge, ConstantScalersGetFactorOne) {
  // Every block has absmax 2: the centred scalers are all zero.
  const auto L = layout({8, 64}, 64, 4);
  std::vector<float> x(L.numel());
  for (int64_t i = 0; i < L.numel(); ++i) x[i] = (i % 64 == 0) ? 2.0f : 0.25f * ((i % 7) - 3);
  expect_matches_reference<float>(x, L);
  const auto t = quantize(x, L);
  for (int64_t g = 0; g < L.num_scaler_blocks(); ++g) EXPECT_EQ(t.quantization_factor(g), 1.0f);
  for (int64_t b = 0; b < L.num_blocks(); ++b) EXPECT_EQ(t.quantized_scalers(b), 0);
  EXPECT_EQ(t.scaler_mean, 2.0f);
  const auto deq = dequantize<float>(t);
  for (int64_t i = 0; i < L.numel(); i += 64) EXPECT_EQ(deq[i], 2.0f);
}

TEST(Nf4Edge, ExtremeMagnitudes) {
  const auto L = layout({4, 64}, 64, 2);
  auto x = randn(L.numel(), 4);
  for (int i = 0; i < 64; ++i) x[i] *= 1e30f;
  for (int i = 64; i < 128; ++i) x[i] *= 1e-30f;
  expect_matches_reference<float>(x, L);
}

TEST(Nf4Edge, StoreVariantsAgree) {
  const auto L = layout({256, 256});
  const auto t = quantize(randn(L.numel(), 5), L);
  const auto a = dequantize<float>(t, kqlora::Nf4Store::cached);
  const auto b = dequantize<float>(t, kqlora::Nf4Store::streaming);
  const auto c = dequantize_portable<float, float>(t);
  const auto d = dequantize_bytes<float, float>(t);  // (the GPU body, run on the host)
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size()));
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), 4 * a.size()));
  EXPECT_EQ(0, std::memcmp(a.data(), d.data(), 4 * a.size()));
  // A range of blocks (an FSDP shard's, a row panel's): from block 7 on, 100 blocks.
  const auto e = dequantize_bytes<float, float>(t, 7, 100);
  EXPECT_EQ(0, std::memcmp(a.data() + 7 * 64, e.data(), 4 * e.size()));
  // float32 NF4 to bfloat16: the float32 value rounded once.
  const auto h = dequantize<bfloat16>(t, kqlora::Nf4Store::streaming);
  const auto h2 = dequantize_portable<float, bfloat16>(t);
  const auto h3 = dequantize_bytes<float, bfloat16>(t);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(h[i].bits, bfloat16(a[i]).bits) << i;
    ASSERT_EQ(h2[i].bits, bfloat16(a[i]).bits) << i;
    ASSERT_EQ(h3[i].bits, bfloat16(a[i]).bits) << i;
  }
}

TEST(Nf4Edge, QuantizingTwiceGivesTheSameBytes) {
  const auto L = layout({512, 128});
  const auto x = randn(L.numel(), 6);
  const auto a = quantize(x, L), b = quantize(x, L);
  EXPECT_EQ(0, std::memcmp(a.quantized_data.data(), b.quantized_data.data(), L.num_bytes()));
  EXPECT_EQ(bits(a.scaler_mean), bits(b.scaler_mean));
}

#ifdef KOKKOS_ENABLE_SERIAL
TEST(Nf4Edge, SerialAndDefaultSpaceGiveTheSameBytes) {
  // Fixed-order reductions: the bytes do not depend on the backend or its thread count
  // (with Kokkos OpenMP this compares 1 thread against OMP_NUM_THREADS).
  auto L = layout({1000, 64}, 64, 256);  // 1000 blocks: 3 full scaler blocks and a partial one
  const auto x = randn(L.numel(), 8, 5.0f);
  const auto a = quantize(x, L);
  Kokkos::View<const float*, Kokkos::HostSpace> in(
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(x.data(), x.size()));
  const auto b = kqlora::nf4_quantize<float>(Kokkos::Serial(), in, L);
  EXPECT_EQ(0, std::memcmp(a.quantized_data.data(), b.quantized_data.data(), L.num_bytes()));
  EXPECT_EQ(0, std::memcmp(a.quantized_scalers.data(), b.quantized_scalers.data(), L.num_blocks()));
  EXPECT_EQ(0, std::memcmp(a.quantization_factor.data(), b.quantization_factor.data(),
                           4 * L.num_scaler_blocks()));
  EXPECT_EQ(bits(a.scaler_mean), bits(b.scaler_mean));
}
#endif

namespace {
void expect_input_error(const std::vector<float>& x, const kqlora::Nf4Layout& L,
                        const std::string& needle) {
  try {
    quantize(x, L);
    ADD_FAILURE() << "accepted a bad tensor; expected: " << needle;
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Nf4Edge, BadSizesNameTheConstraint) {
  expect_input_error(std::vector<float>(100), layout({10, 10}), "not a multiple of block_size 64");
  expect_input_error(std::vector<float>(99), layout({99}, 33), "positive even number");
  expect_input_error(std::vector<float>(128), layout({2, 2, 32}), "1-D or 2-D");
  expect_input_error(std::vector<float>(128), layout({128}, 64, 0), "scaler_block_size");
  expect_input_error(std::vector<float>(64), layout({128}), "64 elements for shape [128]");
  auto nan = randn(128, 7);
  nan[77] = NAN;
  expect_input_error(nan, layout({128}), "NaN or Inf");
  nan[77] = INFINITY;
  expect_input_error(nan, layout({128}), "NaN or Inf");
}

TEST(Nf4Edge, BlockRangesMatchTheWholeTensor) {
  const auto L = layout({96, 96}, 32, 5);  // 288 blocks, partial last scaler block
  const auto t = quantize(randn(L.numel(), 9), L);
  const auto whole = dequantize<float>(t);
  auto dt = kqlora::nf4_copy_to<Mem>(t);
  for (auto [first, count] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 288}, {3, 7}, {287, 1}, {100, 0}}) {
    Kokkos::View<float*, Mem> out("out", std::max<int64_t>(1, count * 32));
    kqlora::nf4_dequantize_blocks(Exec(), dt, first, count, out);
    const auto h = to_host(out);
    for (int64_t i = 0; i < count * 32; ++i)
      ASSERT_EQ(bits(h[i]), bits(whole[first * 32 + i])) << i;
  }
  Kokkos::View<float*, Mem> out("out", 64);
  EXPECT_THROW(kqlora::nf4_dequantize_blocks(Exec(), dt, 287, 2, out), kqlora::Error);
}
