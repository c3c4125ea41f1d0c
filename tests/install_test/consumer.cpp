// Quantizes and dequantizes a small tensor through the installed kqlora.
#include <cmath>
#include <cstdio>

#include "kqlora/core/build_info.hpp"
#include "kqlora/core/runtime.hpp"
#include "kqlora/quant/nf4_kernels.hpp"

int main(int argc, char** argv) {
  kqlora::Runtime runtime(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  kqlora::Nf4Layout layout;
  layout.shape = {64, 64};
  Kokkos::View<float*, Exec::memory_space> x("x", 4096), y("y", 4096);
  Kokkos::deep_copy(x, 0.5f);
  auto nf4 = kqlora::nf4_quantize<float>(Exec(), Kokkos::View<const float*, Exec::memory_space>(x),
                                         layout);
  kqlora::nf4_dequantize(Exec(), nf4, y);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  std::printf("kqlora %s: dequantized %g\n", kqlora::version().c_str(), h(7));
  return std::fabs(h(7) - 0.5f) < 1e-6 ? 0 : 1;
}
