#pragma once
// The GPU a rank computes on (CUDA builds): which physical device it is and how much of its
// memory is free. The communicator choice (parallel/comm_choice.hpp) and the memory check
// (train/memory_check.hpp) use them; a build without CUDA has no GPU.

#include <string>

#include "kqlora/core/memory_budget.hpp"

namespace kqlora {

/// The GPU this process's Kokkos computes on (its CUDA device ordinal); -1 without CUDA.
int gpu_ordinal();

/// GPU `device`'s UUID as nvidia-smi writes it ("GPU-3f2a..."): which physical GPU a rank
/// uses, whatever CUDA_VISIBLE_DEVICES numbers it. Empty without CUDA.
std::string gpu_uuid(int device);

/// GPU `device`'s free memory now (cudaMemGetInfo: after this process's CUDA context, and
/// whatever other processes hold), with its total in the source. KQLORA_GPU_MEMORY_LIMIT
/// (bytes) replaces it, also in a build without CUDA: a test hook, and a way to plan for
/// another GPU. Without either, bytes is 0 (unknown).
MemoryBudget gpu_free_memory(int device);

}  // namespace kqlora
