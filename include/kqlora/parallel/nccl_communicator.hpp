#pragma once
// The NCCL backend (built with KQLORA_ENABLE_NCCL): collectives on device memory of GPU
// `device`, ordered after the work queued on `compute_stream` (a cudaStream_t, e.g.
// Kokkos::Cuda().cuda_stream()). Needs MPI initialised (the bootstrap); a build without MPI
// gets a world of one.

#include <memory>

#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream);

}  // namespace kqlora
