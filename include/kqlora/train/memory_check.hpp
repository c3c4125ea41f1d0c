#pragma once
// Before the first allocation: what a run will hold per rank (its model, optimizer state,
// activations and data, estimated from the deck and, for a Hugging Face model, its
// config.json), against its share of the node's memory: 0.9 x min(cgroup limit, MemTotal)
// / ranks per node, memory shared by a node's ranks counted once. A run that cannot fit is
// refused naming the keys and the estimate (memory_check = off runs it anyway) instead of
// being killed by the kernel minutes later. Where the model lives in GPU memory (a CUDA
// build) its tensors, optimizer state and activations are checked against the GPU's free
// memory shared by the ranks on that GPU, and what stays on the host (data, staging, the
// libraries) against the node's. docs/TRAINING.md, docs/GPU.md.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/core/memory_budget.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

/// Where a run's model lives, and what that costs beside it.
struct MemoryPlacement {
  bool device = false;       // the model, gradients, optimizer state, activations on a GPU
  int ranks_per_device = 1;  // the ranks computing on this rank's GPU (they share it)
  MemoryBudget device_free;  // that GPU's free memory before the run allocates (0: unknown)
  bool nccl = false;         // NCCL's staging buffers (bounded: parallel/nccl_communicator.hpp)
  /// The communicator reduces device buffers in place (NCCL, a GPU-aware MPI); otherwise
  /// DDP's gradients are staged through a host copy.
  bool device_collectives = false;
};

/// This build's placement: host memory, or (a CUDA build) the GPU Kokkos computes on, its
/// free memory read now (core/gpu_device.hpp).
MemoryPlacement build_placement(int ranks_per_device, bool nccl, bool device_collectives);

struct MemoryEstimate {
  /// Bytes per rank, by what holds them: in host memory, and (a device run) in GPU memory.
  std::vector<std::pair<std::string, int64_t>> parts, device_parts;
  /// The most a rank's memory reaches (an upper bound of its tracked allocations and of its
  /// RSS above start-up, docs/TRAINING.md): the larger of set-up and training, with memory
  /// it maps from a node-shared copy (node-shared DDP's trainable weights) counted in full,
  /// plus an allowance for what no allocation of kqlora's holds (GEMM packing, MPI,
  /// libraries).
  int64_t per_rank = 0;
  /// Of per_rank, what is node-shared (counted once per node by the check).
  int64_t node_shared = 0;
  int64_t budget_per_rank = 0;  // 0: the node's memory is unknown
  std::string budget_source;    // how the budget was found
  int ranks_per_node = 1;
  /// A device run: the GPU part's total, and the rank's share of the GPU's free memory
  /// (0.9 x free / ranks on that GPU; 0: unknown).
  int64_t device_per_rank = 0, device_budget_per_rank = 0;
  std::string device_budget_source;
  int ranks_per_device = 1;
  /// The estimate as lines for the log and --dry-run.
  std::string report() const;
};

/// The estimate for `c` at `world_size` ranks, `ranks_per_node` of them on this node, over
/// token rows of `seq_len` positions (0: the model has no tokens or the length is not known
/// yet). Sizes are overflow-checked (InputError).
MemoryEstimate estimate_memory(const Config& c, int world_size, int ranks_per_node, int64_t seq_len,
                               const MemoryPlacement& where = {});
/// InputError (naming `where`, the keys that size the run and the estimate) when the
/// estimate, its node-shared part counted once per node, exceeds the rank's share of the
/// node's memory, or its GPU part the rank's share of the GPU's, unless memory_check = off.
void check_memory(const Config& c, int world_size, int ranks_per_node, int64_t seq_len,
                  const std::string& where, const MemoryPlacement& placement = {});

}  // namespace kqlora
