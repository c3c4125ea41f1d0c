#include "kqlora/core/fma_peak.hpp"

#include <algorithm>
#include <chrono>

#include "kqlora/core/cpu_features.hpp"

namespace kqlora {

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
    // The AVX-512 and AVX2 loops are one text over two register files: registers 0-13
    // zeroed (vpxord: AVX-512F alone zeroes a zmm), then 12 independent FMAs per iteration
    // into 0-11 from the zero operands 12 and 13.
#define KQ_ZERO(OP, R, i) OP " %%" R #i ", %%" R #i ", %%" R #i "\n"
#define KQ_FMA(R, i) "vfmadd231ps %%" R "12, %%" R "13, %%" R #i "\n"
// (clang-format has no fixed point for this macro's layout)
// clang-format off
#define KQ_FMA_LOOP(OP, R)                                                                  \
  KQ_ZERO(OP, R, 0) KQ_ZERO(OP, R, 1) KQ_ZERO(OP, R, 2) KQ_ZERO(OP, R, 3) KQ_ZERO(OP, R, 4) \
  KQ_ZERO(OP, R, 5) KQ_ZERO(OP, R, 6) KQ_ZERO(OP, R, 7) KQ_ZERO(OP, R, 8) KQ_ZERO(OP, R, 9) \
  KQ_ZERO(OP, R, 10) KQ_ZERO(OP, R, 11) KQ_ZERO(OP, R, 12) KQ_ZERO(OP, R, 13)               \
  "1:\n"                                                                                    \
  KQ_FMA(R, 0) KQ_FMA(R, 1) KQ_FMA(R, 2) KQ_FMA(R, 3) KQ_FMA(R, 4) KQ_FMA(R, 5)             \
  KQ_FMA(R, 6) KQ_FMA(R, 7) KQ_FMA(R, 8) KQ_FMA(R, 9) KQ_FMA(R, 10) KQ_FMA(R, 11)           \
  "dec %0\njnz 1b\nvzeroupper\n"
// clang-format on
#define KQ_CLOBBERS                                                                        \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13", "cc"
  if (loop.width_bits == 512) {
    __asm__ volatile(KQ_FMA_LOOP("vpxord", "zmm") : "+r"(n) : : KQ_CLOBBERS);
  } else if (loop.width_bits == 256) {
    __asm__ volatile(KQ_FMA_LOOP("vxorps", "ymm") : "+r"(n) : : KQ_CLOBBERS);
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
        : KQ_CLOBBERS);
  }
#undef KQ_ZERO
#undef KQ_FMA
#undef KQ_FMA_LOOP
#undef KQ_CLOBBERS
#else
  (void)loop;
  (void)iterations;
#endif
}

double fma_peak_flops(double seconds) {
  const FmaLoop loop = fma_loop();
  using Clock = std::chrono::steady_clock;
  auto timed = [&](int64_t n) {
    const auto t0 = Clock::now();
    run_fma_loop(loop, n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  int64_t n = 1 << 16;  // about a millisecond at the widest width
  while (timed(n) < 2e-3 && n < (int64_t(1) << 40)) n *= 2;
  double best = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  do {  // (the best of several: another process may have had the core)
    best = std::max(best, loop.flops_per_iteration * static_cast<double>(n) / timed(n));
  } while (Clock::now() < end);
  return best;
}

}  // namespace kqlora
