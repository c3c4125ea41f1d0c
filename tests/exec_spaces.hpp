#pragma once
// The Kokkos execution spaces this build enables, as a googletest type list: a test body
// written once (TYPED_TEST) runs on each of them. Kokkos 3.4 from Debian has Serial only;
// a Kokkos 4 build with Serial and OpenMP runs both (several threads expose races Serial
// hides); a CUDA build adds Cuda.

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

namespace kqlora_test {

template <class... Ts>
struct SpaceList {
  using types = ::testing::Types<Ts...>;
};
template <class L, class T>
struct Append;
template <class... Ts, class T>
struct Append<SpaceList<Ts...>, T> {
  using type = SpaceList<Ts..., T>;
};

using Spaces0 = SpaceList<>;
#if defined(KOKKOS_ENABLE_SERIAL)
using Spaces1 = Append<Spaces0, Kokkos::Serial>::type;
#else
using Spaces1 = Spaces0;
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
using Spaces2 = Append<Spaces1, Kokkos::OpenMP>::type;
#else
using Spaces2 = Spaces1;
#endif
#if defined(KOKKOS_ENABLE_THREADS)
using Spaces3 = Append<Spaces2, Kokkos::Threads>::type;
#else
using Spaces3 = Spaces2;
#endif
#if defined(KOKKOS_ENABLE_CUDA)
using Spaces4 = Append<Spaces3, Kokkos::Cuda>::type;
#else
using Spaces4 = Spaces3;
#endif

using EnabledSpaces = Spaces4::types;

/// Names the space in test names (TYPED_TEST_SUITE's third argument).
struct SpaceName {
  template <class T>
  static std::string GetName(int) {
    return T::name();
  }
};

}  // namespace kqlora_test
