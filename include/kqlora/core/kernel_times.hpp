#pragma once
// Where a run's time goes, kernel by kernel (KQLORA_KERNEL_TIMES=1, docs/BENCHMARKS.md):
// Kokkos Tools callbacks set in-process time each parallel_for, parallel_reduce and
// parallel_scan by its label with a host clock. Exact on host back ends (Serial, OpenMP:
// a kernel returns when it is done). With Kokkos >= 3.6 tool callbacks make Kokkos fence
// around every kernel (its tools' default), so on a GPU the times are the kernels' own too,
// but the run is serialised: no overlap of kernels with communication while it is on (a
// diagnostic, never for a production run). What no Kokkos kernel runs (the vendor GEMMs,
// host code) is the rest of the time. Off unless asked. Where a Kokkos Tools library is
// loaded (KOKKOS_TOOLS_LIBS) its callbacks are left alone and nothing is timed.

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
