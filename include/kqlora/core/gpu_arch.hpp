#pragma once
// The GPU code a CUDA build carries, and whether the GPUs in sight can run it: checked
// before Kokkos starts, so that a wrong GPU or none at all ends a run with a message that
// says so instead of a kernel-image error or an abort inside Kokkos (docs/GPU.md).

#include <string>

namespace kqlora {

/// The compute capability the build's device code is for (Kokkos_ARCH_*), as 10 * major +
/// minor (90 for HOPPER90); 0 in a build without CUDA.
int built_compute_capability();

/// "sm_90 code and compute_90 PTX" in a CUDA build; empty without CUDA.
std::string describe_gpu_code();

/// In a CUDA build: throws InputError naming the GPU when no CUDA device is visible
/// ("no CUDA device ...") or when a visible one has an older compute capability than the
/// build's (its code cannot run there). A newer GPU runs the build's PTX, compiled by the
/// driver at start-up. Does nothing without CUDA.
void check_gpus_run_this_build();

}  // namespace kqlora
