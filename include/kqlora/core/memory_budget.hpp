#pragma once
// The memory a node gives a job: the smaller of the cgroup's limit (memory.max, cgroup v2;
// memory.limit_in_bytes, v1) and the machine's MemTotal. The memory check of a run
// (train/memory_check.hpp) divides it among the ranks of a node.

#include <cstdint>
#include <string>

namespace kqlora {

struct MemoryBudget {
  int64_t bytes = 0;   // 0: unknown (nothing is checked)
  std::string source;  // e.g. "MemTotal 23.4 GiB" or "cgroup memory.max 8.0 GiB"
};

/// This node's memory. KQLORA_MEMORY_LIMIT (bytes) replaces what the system says: a test
/// hook, and a way to plan for another machine.
MemoryBudget node_memory();

}  // namespace kqlora
