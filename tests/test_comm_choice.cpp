// comm = auto / mpi / nccl against where the ranks compute (parallel/comm_choice.hpp): NCCL
// needs a GPU of its own for every rank.
#include <gtest/gtest.h>

#include "kqlora/core/error.hpp"
#include "kqlora/parallel/comm_choice.hpp"

namespace {

using kqlora::choose_comm;
using kqlora::DevicePlace;

std::string input_error(const std::string& requested, const std::vector<DevicePlace>& places,
                        bool have_nccl = true) {
  try {
    choose_comm(requested, true, have_nccl, places);
  } catch (const kqlora::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(CommChoice, OneGpuPerRankTakesNccl) {
  const std::vector<DevicePlace> p = {{"n1", "GPU-a"}, {"n1", "GPU-b"}, {"n2", "GPU-a"}};
  // (the same UUID on two hosts is two GPUs: only a (host, GPU) pair is one)
  const auto c = choose_comm("auto", true, true, p);
  EXPECT_TRUE(c.nccl);
  EXPECT_NE(c.note.find("NCCL"), std::string::npos) << c.note;
  EXPECT_TRUE(choose_comm("nccl", true, true, p).nccl);
}

TEST(CommChoice, RanksSharingAGpuTakeMpiOnAutoAndAreRefusedOnNccl) {
  const std::vector<DevicePlace> p = {
      {"n1", "GPU-a"}, {"n1", "GPU-b"}, {"n1", "GPU-a"}, {"n1", "GPU-a"}};
  const auto c = choose_comm("auto", true, true, p);
  EXPECT_FALSE(c.nccl);
  EXPECT_NE(c.note.find("ranks 0, 2 and 3 share GPU GPU-a on n1"), std::string::npos) << c.note;
  EXPECT_NE(c.note.find("using MPI"), std::string::npos) << c.note;
  const std::string e = input_error("nccl", p);
  EXPECT_NE(e.find("comm = nccl: ranks 0, 2 and 3 share GPU GPU-a on n1"), std::string::npos) << e;
}

TEST(CommChoice, MpiHostMemoryAndBuildsWithoutNccl) {
  const std::vector<DevicePlace> shared = {{"n1", "GPU-a"}, {"n1", "GPU-a"}};
  const auto mpi = choose_comm("mpi", true, true, shared);
  EXPECT_FALSE(mpi.nccl);
  EXPECT_TRUE(mpi.note.empty());
  EXPECT_FALSE(choose_comm("auto", false, true, {{"n1", ""}, {"n2", ""}}).nccl);
  EXPECT_FALSE(choose_comm("auto", true, false, shared).nccl);
  EXPECT_NE(input_error("nccl", {}, false).find("built without NCCL"), std::string::npos);
  // A world of one on one GPU: NCCL (nothing shared).
  EXPECT_TRUE(choose_comm("auto", true, true, {{"n1", "GPU-a"}}).nccl);
}

}  // namespace
