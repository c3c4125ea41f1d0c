#pragma once
// One core's peak float32 FMA throughput: a register-only loop at the widest vector width
// this CPU supports, chosen at run time (whatever KQLORA_NATIVE compiled for).

#include <cstdint>
#include <string>

namespace kqlora {

struct FmaLoop {
  int width_bits = 0;  ///< 512, 256 or 128 (128: SSE multiply + add, no FMA)
  std::string name;    ///< "AVX-512 FMA", "AVX2 FMA", "SSE mul+add"
  double flops_per_iteration = 0;
};

/// The loop for this CPU.
FmaLoop fma_loop();

/// Runs `iterations` of the loop: 12 independent accumulators (covering an FMA latency of
/// 4 cycles on 2 pipes, with room), all in registers.
void run_fma_loop(const FmaLoop& loop, int64_t iterations);

/// One core's float32 FMA peak in FLOP/s: the best of repeated runs of fma_loop() over
/// about `seconds` (model-FLOPs utilisation is measured against it).
double fma_peak_flops(double seconds);

}  // namespace kqlora
