#pragma once
// What the CPU can do, read from CPUID at run time (whatever the compiler flags were): the
// vendor, family and model, and the vector FMA widths the OS has enabled. The BLAS kernel
// choice (blas_tuning.hpp) and kqlora-bench's FMA peak use it.

#include <string>

namespace kqlora {

struct CpuFeatures {
  std::string vendor;  ///< "GenuineIntel", "AuthenticAMD", ... ("" where unknown)
  std::string brand;   ///< the model string, e.g. "AMD EPYC 7B13"
  int family = 0, model = 0;
  bool avx2 = false, fma = false;  ///< AVX2 and FMA3, with the OS saving the ymm state
  /// AVX-512 F, BW, DQ and VL all present, with the OS saving the zmm state.
  bool avx512 = false;
  bool avx512_bf16 = false;

  /// Widest vector FMA in bits: 512, 256, or 0 (none).
  int fma_width() const { return avx512 ? 512 : (avx2 && fma ? 256 : 0); }
  /// "AMD EPYC 7B13 (AuthenticAMD family 25 model 1, AVX2+FMA)".
  std::string describe() const;
};

/// This machine's CPU (x86-64; elsewhere every feature is false).
const CpuFeatures& cpu_features();

}  // namespace kqlora
