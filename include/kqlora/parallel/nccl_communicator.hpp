#pragma once
// The NCCL backend (built with KQLORA_ENABLE_NCCL): collectives on device memory of GPU
// `device`, ordered after the work queued on `compute_stream` (a cudaStream_t, e.g.
// Kokkos::Cuda().cuda_stream()). Needs MPI initialised (the bootstrap); a build without MPI
// gets a world of one.

#include <memory>
#include <string>

#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

/// `timeout_s` (comm_timeout_s) bounds its start-up already: the id's broadcast and
/// ncclCommInitRank wait for every rank.
std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream,
                                                     double timeout_s = 300);

/// GPU `device`'s UUID as nvidia-smi writes it ("GPU-3f2a..."): which physical GPU a rank
/// uses, whatever CUDA_VISIBLE_DEVICES numbers it (comm_choice.hpp).
std::string cuda_device_uuid(int device);

}  // namespace kqlora
