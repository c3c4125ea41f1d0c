#include "kqlora/core/gpu_arch.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <sstream>

#include "kqlora/core/error.hpp"
#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace kqlora {

int built_compute_capability() {
  // (one Kokkos_ARCH_* of an NVIDIA GPU is defined in a CUDA build; newest first)
#if defined(KOKKOS_ARCH_BLACKWELL120)
  return 120;
#elif defined(KOKKOS_ARCH_BLACKWELL100)
  return 100;
#elif defined(KOKKOS_ARCH_HOPPER90)
  return 90;
#elif defined(KOKKOS_ARCH_ADA89)
  return 89;
#elif defined(KOKKOS_ARCH_AMPERE86)
  return 86;
#elif defined(KOKKOS_ARCH_AMPERE80)
  return 80;
#elif defined(KOKKOS_ARCH_TURING75)
  return 75;
#elif defined(KOKKOS_ARCH_VOLTA72)
  return 72;
#elif defined(KOKKOS_ARCH_VOLTA70)
  return 70;
#else
  return 0;
#endif
}

std::string describe_gpu_code() {
#ifdef KOKKOS_ENABLE_CUDA
  const int cc = built_compute_capability();
  std::ostringstream os;
  os << "sm_" << cc << " code and compute_" << cc << " PTX";
  return os.str();
#else
  return "";
#endif
}

void check_gpus_run_this_build() {
#ifdef KOKKOS_ENABLE_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  KQLORA_INPUT_CHECK(
      rc == cudaSuccess && count > 0,
      "no CUDA device visible to this process ("
          << (rc == cudaSuccess ? "cudaGetDeviceCount found none"
                                : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc))
          << "; CUDA_VISIBLE_DEVICES="
          << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)")
          << "): this build computes on a GPU");
  const int built = built_compute_capability();
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    const cudaError_t p = cudaGetDeviceProperties(&prop, d);
    KQLORA_INPUT_CHECK(p == cudaSuccess, "CUDA device " << d << ": cudaGetDeviceProperties: "
                                                        << cudaGetErrorString(p));
    const int cc = 10 * prop.major + prop.minor;
    KQLORA_INPUT_CHECK(cc >= built, "CUDA device "
                                        << d << " (" << prop.name << ") has compute capability "
                                        << prop.major << "." << prop.minor
                                        << "; this build's GPU code is for " << built / 10 << "."
                                        << built % 10 << " (" << describe_gpu_code()
                                        << ") and cannot run there: rebuild with that "
                                           "GPU's Kokkos_ARCH (tools/build_cuda.sh --arch)");
  }
#endif
}

}  // namespace kqlora
