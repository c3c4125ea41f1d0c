#pragma once
// The NCCL backend (built with KQLORA_ENABLE_NCCL): collectives on device memory of GPU
// `device`, ordered after the work queued on `compute_stream` (a cudaStream_t, e.g.
// Kokkos::Cuda().cuda_stream()). Needs MPI initialised (the bootstrap); a build without MPI
// gets a world of one.

#include <cstdint>
#include <memory>

#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

/// The most its staging buffers hold at once (a device scratch buffer, and as much
/// page-locked host memory): collectives on host buffers larger than this stream through them
/// in pieces.
constexpr int64_t kNcclStagingBytes = int64_t(64) << 20;

/// `timeout_s` (comm_timeout_s) bounds its start-up already: the id's broadcast and
/// ncclCommInitRank wait for every rank.
std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream,
                                                     double timeout_s = 300);

}  // namespace kqlora
