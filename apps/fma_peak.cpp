#include "fma_peak.hpp"

#include "kqlora/core/cpu_features.hpp"

namespace kqlora::bench {

FmaLoop fma_loop() {
  const auto& cpu = cpu_features();
  if (cpu.avx512) return {512, "AVX-512 FMA", 12 * 16 * 2.0};
  if (cpu.avx2 && cpu.fma) return {256, "AVX2 FMA", 12 * 8 * 2.0};
  return {128, "SSE mul+add", 6 * 4 * 2.0};
}

// Inline assembly: the assembler takes every instruction whatever -march says, so each
// loop exists in every build and runs only where CPUID allows it. The operands stay zero
// (no denormals); registers 0-13 only.
void run_fma_loop(const FmaLoop& loop, int64_t iterations) {
#if defined(__x86_64__)
  int64_t n = iterations;
  if (n <= 0) return;
  if (loop.width_bits == 512) {
    __asm__ volatile(
        "vpxord %%zmm0, %%zmm0, %%zmm0\n"
        "vpxord %%zmm1, %%zmm1, %%zmm1\n"
        "vpxord %%zmm2, %%zmm2, %%zmm2\n"
        "vpxord %%zmm3, %%zmm3, %%zmm3\n"
        "vpxord %%zmm4, %%zmm4, %%zmm4\n"
        "vpxord %%zmm5, %%zmm5, %%zmm5\n"
        "vpxord %%zmm6, %%zmm6, %%zmm6\n"
        "vpxord %%zmm7, %%zmm7, %%zmm7\n"
        "vpxord %%zmm8, %%zmm8, %%zmm8\n"
        "vpxord %%zmm9, %%zmm9, %%zmm9\n"
        "vpxord %%zmm10, %%zmm10, %%zmm10\n"
        "vpxord %%zmm11, %%zmm11, %%zmm11\n"
        "vpxord %%zmm12, %%zmm12, %%zmm12\n"
        "vpxord %%zmm13, %%zmm13, %%zmm13\n"
        "1:\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm0\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm1\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm2\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm3\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm4\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm5\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm6\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm7\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm8\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm9\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm10\n"
        "vfmadd231ps %%zmm12, %%zmm13, %%zmm11\n"
        "dec %0\n"
        "jnz 1b\n"
        "vzeroupper\n"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "cc");
  } else if (loop.width_bits == 256) {
    __asm__ volatile(
        "vxorps %%ymm0, %%ymm0, %%ymm0\n"
        "vxorps %%ymm1, %%ymm1, %%ymm1\n"
        "vxorps %%ymm2, %%ymm2, %%ymm2\n"
        "vxorps %%ymm3, %%ymm3, %%ymm3\n"
        "vxorps %%ymm4, %%ymm4, %%ymm4\n"
        "vxorps %%ymm5, %%ymm5, %%ymm5\n"
        "vxorps %%ymm6, %%ymm6, %%ymm6\n"
        "vxorps %%ymm7, %%ymm7, %%ymm7\n"
        "vxorps %%ymm8, %%ymm8, %%ymm8\n"
        "vxorps %%ymm9, %%ymm9, %%ymm9\n"
        "vxorps %%ymm10, %%ymm10, %%ymm10\n"
        "vxorps %%ymm11, %%ymm11, %%ymm11\n"
        "vxorps %%ymm12, %%ymm12, %%ymm12\n"
        "vxorps %%ymm13, %%ymm13, %%ymm13\n"
        "1:\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm0\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm1\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm2\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm3\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm4\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm5\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm6\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm7\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm8\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm9\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm10\n"
        "vfmadd231ps %%ymm12, %%ymm13, %%ymm11\n"
        "dec %0\n"
        "jnz 1b\n"
        "vzeroupper\n"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "cc");
  } else {
    __asm__ volatile(
        "xorps %%xmm0, %%xmm0\n"
        "xorps %%xmm1, %%xmm1\n"
        "xorps %%xmm2, %%xmm2\n"
        "xorps %%xmm3, %%xmm3\n"
        "xorps %%xmm4, %%xmm4\n"
        "xorps %%xmm5, %%xmm5\n"
        "xorps %%xmm6, %%xmm6\n"
        "xorps %%xmm7, %%xmm7\n"
        "xorps %%xmm8, %%xmm8\n"
        "xorps %%xmm9, %%xmm9\n"
        "xorps %%xmm10, %%xmm10\n"
        "xorps %%xmm11, %%xmm11\n"
        "xorps %%xmm12, %%xmm12\n"
        "xorps %%xmm13, %%xmm13\n"
        "1:\n"
        "movaps %%xmm12, %%xmm6\n"
        "mulps %%xmm13, %%xmm6\n"
        "addps %%xmm6, %%xmm0\n"
        "movaps %%xmm12, %%xmm7\n"
        "mulps %%xmm13, %%xmm7\n"
        "addps %%xmm7, %%xmm1\n"
        "movaps %%xmm12, %%xmm8\n"
        "mulps %%xmm13, %%xmm8\n"
        "addps %%xmm8, %%xmm2\n"
        "movaps %%xmm12, %%xmm9\n"
        "mulps %%xmm13, %%xmm9\n"
        "addps %%xmm9, %%xmm3\n"
        "movaps %%xmm12, %%xmm10\n"
        "mulps %%xmm13, %%xmm10\n"
        "addps %%xmm10, %%xmm4\n"
        "movaps %%xmm12, %%xmm11\n"
        "mulps %%xmm13, %%xmm11\n"
        "addps %%xmm11, %%xmm5\n"
        "dec %0\n"
        "jnz 1b\n"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "cc");
  }
#else
  (void)loop;
  (void)iterations;
#endif
}

}  // namespace kqlora::bench
