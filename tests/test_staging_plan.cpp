// The NCCL backend's bounded staging (parallel/staging_plan.hpp): collectives on host buffers
// stream through pieces that stay within the bound. Checked by running the pieces against
// simulated collectives of several ranks and comparing with the whole collective.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/parallel/staging_plan.hpp"

namespace {

using kqlora::StagingPiece;

std::vector<char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(g());
  return v;
}

}  // namespace

TEST(StagingPlan, PiecesCoverTheBlockInWholeElementsWithinTheBound) {
  for (const int64_t block : {0, 1, 4, 999, 1000, 1001, 4096, 100003 * 4}) {
    for (const int64_t blocks : {1, 2, 3, 5}) {
      for (const int64_t element : {1, 4, 8}) {
        if (block % element) continue;
        const int64_t cap = 1000;
        const auto pieces = kqlora::staging_pieces(block, blocks, element, cap);
        int64_t next = 0;
        for (const StagingPiece& p : pieces) {
          EXPECT_EQ(p.offset, next);
          EXPECT_EQ(p.bytes % element, 0);
          EXPECT_LE(blocks * p.bytes, cap) << block << " " << blocks << " " << element;
          next += p.bytes;
        }
        EXPECT_EQ(next, block);
        // As few as the bound allows: every piece but the last is the largest whole-element size.
        const int64_t most = cap / blocks / element * element;
        EXPECT_EQ(static_cast<int64_t>(pieces.size()), block == 0 ? 1 : (block + most - 1) / most);
      }
    }
  }
  // A bound too small for one element a block is a program error.
  EXPECT_THROW(kqlora::staging_pieces(64, 5, 8, 39), kqlora::Error);
}

TEST(StagingPlan, AnAllGatherInPiecesEqualsTheWholeOne) {
  const int ranks = 3;
  const int64_t block = 1000, cap = 700;  // 4 blocks a piece: pieces of 175 bytes
  std::vector<std::vector<char>> send(ranks);
  for (int r = 0; r < ranks; ++r) send[r] = random_bytes(block, 11u + r);
  std::vector<char> whole;
  for (int r = 0; r < ranks; ++r) whole.insert(whole.end(), send[r].begin(), send[r].end());
  const auto pieces = kqlora::staging_pieces(block, ranks + 1, 1, cap);
  EXPECT_EQ(pieces.size(), 6u);
  for (int me = 0; me < ranks; ++me) {
    std::vector<char> recv(ranks * block, 0);
    for (const StagingPiece& p : pieces) {
      // What NCCL's all-gather of this piece returns: each rank's piece, side by side.
      std::vector<char> gathered(ranks * p.bytes);
      for (int r = 0; r < ranks; ++r)
        std::memcpy(gathered.data() + r * p.bytes, send[r].data() + p.offset, p.bytes);
      kqlora::unpack_piece(gathered.data(), block, ranks, p, recv.data());
    }
    EXPECT_EQ(recv, whole) << "rank " << me;
  }
}

TEST(StagingPlan, AReduceScatterInPiecesEqualsTheWholeOne) {
  const int ranks = 4;
  const int64_t count = 777, block = 4 * count, cap = 4 * 1000;  // 5 blocks a piece
  // Each rank sends a block per rank; small integers, so any order of the sum is exact.
  std::vector<std::vector<float>> send(ranks, std::vector<float>(ranks * count));
  std::mt19937 g(5);
  for (auto& s : send)
    for (auto& v : s) v = static_cast<float>(static_cast<int>(g() % 201) - 100);
  const auto pieces = kqlora::staging_pieces(block, ranks + 1, 4, cap);
  EXPECT_GT(pieces.size(), 3u);
  for (int me = 0; me < ranks; ++me) {
    std::vector<float> recv(count, -1.0f), expect(count, 0.0f);
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < count; ++i) expect[i] += send[r][me * count + i];
    for (const StagingPiece& p : pieces) {
      // Every rank packs its piece of each destination's block; NCCL sums the packed
      // buffers over ranks and hands rank `me` its slice.
      const int64_t n = p.bytes / 4;
      std::vector<float> sum(ranks * n, 0.0f), packed(ranks * n);
      for (int r = 0; r < ranks; ++r) {
        kqlora::pack_piece(reinterpret_cast<const char*>(send[r].data()), block, ranks, p,
                           reinterpret_cast<char*>(packed.data()));
        for (int64_t i = 0; i < ranks * n; ++i) sum[i] += packed[i];
      }
      std::memcpy(reinterpret_cast<char*>(recv.data()) + p.offset, sum.data() + me * n, p.bytes);
    }
    EXPECT_EQ(recv, expect) << "rank " << me;
  }
}
