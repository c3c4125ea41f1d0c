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

/// Runs an all-reduce (and, `gathers`, an all-gather and a reduce-scatter: FSDP's) of one
/// element and of `bytes` (at most kNcclStagingBytes; e.g. a DDP bucket) on `comm`, an NCCL
/// communicator, on device buffers freed after: NCCL makes buffers at its first
/// collectives (NVLS's on NVSwitch nodes, about 1 GiB), which a read of the free GPU
/// memory after this then counts. Every wait within comm_timeout_s (as every collective's).
void nccl_warm_up(Communicator& comm, int64_t bytes, bool gathers);

}  // namespace kqlora
