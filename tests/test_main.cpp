// The test harness: MPI (when built with it) and Kokkos around GoogleTest.
#include <gtest/gtest.h>

#include "kqlora/core/runtime.hpp"

int main(int argc, char** argv) {
  kqlora::Runtime runtime(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
