#include "kqlora/core/build_info.hpp"

#include <Kokkos_Core.hpp>

#include <sstream>

#include "kqlora/build_config.hpp"
#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/cpu_features.hpp"
#include "kqlora/core/gemm_engine.hpp"
#include "kqlora/core/gpu_arch.hpp"
#if KQLORA_HAVE_MPI
#include <mpi.h>
#endif
#if KQLORA_HAVE_HDF5
#include <hdf5.h>
#endif

namespace kqlora {

std::string version() {
  return KQLORA_VERSION_STRING;
}

std::string build_configuration() {
  std::ostringstream os;
  os << "kqlora " << KQLORA_VERSION_STRING << " (" << KQLORA_BUILD_TYPE << ")\n";
  os << "  Kokkos " << KOKKOS_VERSION / 10000 << "." << KOKKOS_VERSION / 100 % 100 << "."
     << KOKKOS_VERSION % 100 << ", backends:";
#ifdef KOKKOS_ENABLE_SERIAL
  os << " Serial";
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  os << " OpenMP";
#endif
#ifdef KOKKOS_ENABLE_THREADS
  os << " Threads";
#endif
#ifdef KOKKOS_ENABLE_CUDA
  os << " CUDA";
#endif
  os << " (default: " << Kokkos::DefaultExecutionSpace::name() << ")\n";
#ifdef KOKKOS_ENABLE_CUDA
  os << "  GPU code: " << describe_gpu_code() << "\n";
#endif
#if KQLORA_HAVE_MPI
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) len = 0;
  std::string mpi(lib, len);
  if (auto nl = mpi.find_first_of(",\n"); nl != std::string::npos) mpi.resize(nl);
  os << "  MPI: " << mpi << "\n";
#else
  os << "  MPI: disabled\n";
#endif
#if KQLORA_HAVE_HDF5
  unsigned maj = 0, min = 0, rel = 0;
  if (H5get_libversion(&maj, &min, &rel) < 0) maj = min = rel = 0;
  os << "  HDF5: " << maj << "." << min << "." << rel << " (parallel)\n";
#else
  os << "  HDF5: disabled (no checkpoints)\n";
#endif
#if KQLORA_HAVE_NCCL
  os << "  NCCL: built\n";
#else
  os << "  NCCL: not built (no CUDA backend)\n";
#endif
  // What the library was compiled for (src/quant/nf4_host_simd_intrinsics.hpp chooses its NF4
  // bodies from the same macros).
#if defined(__AVX512F__) && defined(__AVX512BW__)
  os << "  host SIMD (NF4): AVX-512\n";
#elif defined(__AVX2__)
  os << "  host SIMD (NF4): AVX2 (dequantize; quantize portable)\n";
#else
  os << "  host SIMD (NF4): portable\n";
#endif
  os << "  CPU: " << cpu_features().describe() << "\n";
  os << "  BLAS: " << describe_blas() << "\n";
  os << "  GEMM engine: " << describe_gemm_engine() << "\n";
  os << "  compiler: " << KQLORA_CXX_COMPILER << "\n";
  os << "  flags: " << KQLORA_CXX_FLAGS << "\n";
  return os.str();
}

}  // namespace kqlora
