#pragma once
// Every difference between the Kokkos versions kqlora supports, in one place. The floor
// is Kokkos 3.4 (Debian 12); clusters bring 4.x. Each shim says when it can go.

#include <Kokkos_Core.hpp>

#include <string>

namespace kqlora {

/// Labelled fence of one execution-space instance. (No global fence anywhere: on CUDA
/// Kokkos::fence waits for every stream, NCCL's too, so a dead peer would hang it past
/// comm_timeout_s; ctest no_global_fence.) Remove when the floor is >= 3.6 (labelled
/// fences arrived there).
template <class ExecSpace>
void fence(const ExecSpace& exec, const std::string& label) {
#if KOKKOS_VERSION >= 30600
  exec.fence(label);
#else
  (void)label;
  exec.fence();
#endif
}

/// True when ExecSpace can read memory in MemSpace.
template <class ExecSpace, class MemSpace>
constexpr bool accessible_from() {
  return Kokkos::SpaceAccessibility<ExecSpace, MemSpace>::accessible;
}

/// True when the execution space runs on the host CPU (Serial, OpenMP, Threads).
template <class ExecSpace>
constexpr bool is_host_space() {
  return std::is_same<typename ExecSpace::memory_space, Kokkos::HostSpace>::value;
}

}  // namespace kqlora
