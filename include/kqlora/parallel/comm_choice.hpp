#pragma once
// Which communicator a run uses (deck key `comm`: auto, mpi, nccl; docs/TRAINING.md). NCCL
// needs one GPU per rank: ncclCommInitRank refuses two ranks on one device ("duplicate
// GPU"), so on a node with fewer GPUs than ranks `auto` takes MPI, saying so, and `nccl` is
// refused naming the ranks and the device. The decision is plain data (tested on CPUs);
// the places come from every rank (gather_device_places).

#include <string>
#include <vector>

#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

/// Where a rank computes: its node's host name and its GPU (the device's UUID, which
/// CUDA_VISIBLE_DEVICES renumbering leaves alone; empty without a GPU).
struct DevicePlace {
  std::string host, device;
};

struct CommChoice {
  bool nccl = false;
  std::string note;  // for the log (rank 0): what was chosen and why; empty for `mpi`
};

/// The communicator for `requested` (auto, mpi, nccl) where the model lives in device
/// memory (`device_memory`) and the build has NCCL (`have_nccl`); `places`: every rank's,
/// in rank order. InputError (exit 2) for `nccl` without NCCL or with ranks sharing a GPU.
CommChoice choose_comm(const std::string& requested, bool device_memory, bool have_nccl,
                       const std::vector<DevicePlace>& places);

/// Every rank's place, in rank order (collective over `comm`, within its timeout). Host
/// names are cut at 63 bytes and devices at 47.
std::vector<DevicePlace> gather_device_places(Communicator& comm, const DevicePlace& mine);

/// This process's host name.
std::string host_name();

}  // namespace kqlora
