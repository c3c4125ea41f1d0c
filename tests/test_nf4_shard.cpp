// FSDP sharding in whole scaler blocks: every N from 1 to 8 on awkward shapes, padding as
// docs/NF4.md defines it, and a bit-identical gather.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kqlora/quant/nf4_shard.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;

TEST(Nf4Shard, RoundTripForEveryShardCount) {
  struct Shape {
    int64_t rows, cols, bs, sbs;
  };
  // Scaler blocks: 5 (partial last), 1, 4 exact, 13 with blocks of 7, 100 blocks of 1.
  for (const Shape s : {Shape{300, 64, 64, 64}, Shape{2, 64, 64, 256}, Shape{64, 64, 64, 16},
                        Shape{91, 32, 32, 7}, Shape{10, 10, 10, 1}}) {
    kqlora::Nf4Layout L;
    L.shape = {s.rows, s.cols};
    L.block_size = s.bs;
    L.scaler_block_size = s.sbs;
    std::mt19937 gen(static_cast<unsigned>(s.rows));
    std::normal_distribution<float> d;
    std::vector<float> x(L.numel());
    for (auto& v : x) v = d(gen);
    const auto t = quantize(x, L);
    const int64_t nsb = L.num_scaler_blocks();
    for (int n = 1; n <= 8; ++n) {
      SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " N=" << n);
      std::vector<kqlora::Nf4Shard<Kokkos::HostSpace>> shards;
      int64_t covered = 0;
      for (int r = n - 1; r >= 0; --r) {  // reversed: gather must not rely on order
        auto sh = kqlora::nf4_shard(Kokkos::DefaultHostExecutionSpace(), t, r, n);
        const auto& R = sh.range;
        EXPECT_EQ(R.capacity_scaler_blocks, (nsb + n - 1) / n);
        EXPECT_EQ(static_cast<int64_t>(sh.quantized_scalers.extent(0)),
                  R.capacity_scaler_blocks * L.scaler_block_size);
        EXPECT_EQ(R.first_block, std::min(r * R.capacity_scaler_blocks * s.sbs, L.num_blocks()));
        covered += R.num_blocks;
        // Padding past the real blocks: codes 0x77, q = 0, factor 1.
        for (int64_t j = R.num_blocks * s.bs / 2; j < R.capacity_blocks * s.bs / 2; ++j)
          ASSERT_EQ(sh.quantized_data(j), 0x77);
        for (int64_t b = R.num_blocks; b < R.capacity_blocks; ++b)
          ASSERT_EQ(sh.quantized_scalers(b), 0);
        for (int64_t g = R.num_scaler_blocks; g < R.capacity_scaler_blocks; ++g)
          ASSERT_EQ(sh.quantization_factor(g), 1.0f);
        shards.push_back(sh);
      }
      EXPECT_EQ(covered, L.num_blocks());
      const auto g = kqlora::nf4_gather(Kokkos::DefaultHostExecutionSpace(), shards);
      ASSERT_EQ(g.layout, L);
      EXPECT_EQ(0, std::memcmp(g.quantized_data.data(), t.quantized_data.data(), L.num_bytes()));
      EXPECT_EQ(
          0, std::memcmp(g.quantized_scalers.data(), t.quantized_scalers.data(), L.num_blocks()));
      EXPECT_EQ(0,
                std::memcmp(g.quantization_factor.data(), t.quantization_factor.data(), 4 * nsb));
      EXPECT_EQ(g.scaler_mean, t.scaler_mean);
    }
  }
}

TEST(Nf4Shard, GatherRejectsIncompleteSets) {
  kqlora::Nf4Layout L;
  L.shape = {128, 64};
  std::vector<float> x(L.numel(), 1.0f);
  x[3] = -2.0f;
  const auto t = quantize(x, L);
  auto s0 = kqlora::nf4_shard(Kokkos::DefaultHostExecutionSpace(), t, 0, 2);
  EXPECT_THROW(
      kqlora::nf4_gather(Kokkos::DefaultHostExecutionSpace(), std::vector<decltype(s0)>{s0, s0}),
      kqlora::Error);
  EXPECT_THROW(
      kqlora::nf4_gather(Kokkos::DefaultHostExecutionSpace(), std::vector<decltype(s0)>{s0}),
      kqlora::Error);
  EXPECT_THROW(kqlora::nf4_shard(Kokkos::DefaultHostExecutionSpace(), t, 2, 2), kqlora::InputError);
}
