#include "kqlora/core/gpu_device.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>

#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#ifdef KOKKOS_ENABLE_CUDA
#include "kqlora/core/cuda_check.hpp"
#endif

namespace kqlora {

int gpu_ordinal() {
#ifdef KOKKOS_ENABLE_CUDA
  if (Kokkos::is_initialized()) return Kokkos::Cuda().cuda_device();
  int device = 0;
  KQLORA_CHECK_CUDA(cudaGetDevice(&device));
  return device;
#else
  return -1;
#endif
}

std::string gpu_uuid(int device) {
#ifdef KOKKOS_ENABLE_CUDA
  cudaDeviceProp prop;
  KQLORA_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L writes it.
  std::string id = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    id += hex[b >> 4];
    id += hex[b & 15];
  }
  return id;
#else
  (void)device;
  return "";
#endif
}

MemoryBudget gpu_free_memory(int device) {
  MemoryBudget b;
  if (const char* v = std::getenv("KQLORA_GPU_MEMORY_LIMIT")) {
    char* end = nullptr;
    const long long bytes = std::strtoll(v, &end, 10);
    KQLORA_INPUT_CHECK(end != v && *end == '\0' && bytes > 0,
                       "KQLORA_GPU_MEMORY_LIMIT: a number of bytes, got '" << v << "'");
    b.bytes = bytes;
    b.source = "KQLORA_GPU_MEMORY_LIMIT " + human_bytes(static_cast<double>(b.bytes));
    return b;
  }
#ifdef KOKKOS_ENABLE_CUDA
  int current = 0;
  KQLORA_CHECK_CUDA(cudaGetDevice(&current));
  KQLORA_CHECK_CUDA(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t rc = cudaMemGetInfo(&free_bytes, &total_bytes);
  KQLORA_CHECK_CUDA(cudaSetDevice(current));
  KQLORA_CHECK_CUDA(rc);
  b.bytes = static_cast<int64_t>(free_bytes);
  b.source = "free GPU memory " + human_bytes(static_cast<double>(free_bytes)) + " of " +
             human_bytes(static_cast<double>(total_bytes));
#else
  (void)device;
#endif
  return b;
}

}  // namespace kqlora
