#pragma once
// Where a run's time goes, kernel by kernel (KQLORA_KERNEL_TIMES=1, docs/BENCHMARKS.md):
// Kokkos Tools callbacks set in-process time each parallel_for, parallel_reduce and
// parallel_scan by its label with a host clock. Exact on host back ends (Serial, OpenMP:
// a kernel returns when it is done); on a GPU a launch returns at once, so there the times
// are launch costs unless CUDA_LAUNCH_BLOCKING=1. What no Kokkos kernel runs (the vendor
// GEMMs, host code) is the rest of the time. Off unless asked: the callbacks slow every
// launch a little. Where a Kokkos Tools library is loaded (KOKKOS_TOOLS_LIBS) its callbacks
// are left alone and nothing is timed.

#include <ostream>

namespace kqlora {

/// Starts timing when KQLORA_KERNEL_TIMES is set to 1 (after Kokkos::initialize); whether
/// it did.
bool kernel_times_start();

/// The kernels' times so far, summed by label, largest first (the `top` largest and the
/// rest together), each as a share of `total_seconds`, and the time no kernel ran. Nothing
/// when timing is off.
void kernel_times_report(std::ostream& os, double total_seconds, int top = 25);

}  // namespace kqlora
