#pragma once
// Version and build configuration, as the apps print them on --version.

#include <string>

namespace kqlora {

std::string version();
/// Multi-line description: Kokkos version and backends, MPI, HDF5, NCCL, compiler, flags.
std::string build_configuration();

}  // namespace kqlora
