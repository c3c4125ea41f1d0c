#include "kqlora/train/memory_check.hpp"

#include <sys/stat.h>

#include <sstream>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/memory_budget.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/train/component_configs.hpp"

namespace kqlora {

namespace {

int64_t mul(int64_t a, int64_t b) {
  return checked_mul(a, b, "the memory estimate");
}

int64_t file_bytes(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

}  // namespace

MemoryEstimate estimate_memory(const Config& c, int world_size, int ranks_per_node,
                               int64_t seq_len) {
  const ModelConfig m = model_config(c);
  const ModelKind& kind = model_kind(m.kind);
  const ModelFootprint f = model_footprint(m);
  const bool fsdp = c.parallel == "fsdp";
  // Node-shared DDP: the trainable weights are one copy per node (parallel/ddp_shared_memory),
  // which every rank maps and reads whole (its RSS counts all of it); the frozen base is
  // each rank's own.
  const bool node_shared = !fsdp && c.ddp_shared_memory != "off" && ranks_per_node > 1;
  const int64_t world = std::max(world_size, 1), node = std::max(ranks_per_node, 1);
  MemoryEstimate e;
  e.ranks_per_node = ranks_per_node;
  // NF4: half a byte per element, a scaler byte per block, a float per scaler block.
  const int64_t nf4 = f.nf4_elements / 2 + f.nf4_elements / m.block_size +
                      mul(4, f.nf4_elements / m.block_size / m.scaler_block_size + 1);
  const int64_t dense = mul(4, f.dense_elements);
  e.parts.push_back({"frozen NF4 base", fsdp ? nf4 / world : nf4});
  if (dense > 0) e.parts.push_back({"frozen dense tensors", dense});
  e.parts.push_back({"trainable parameters and gradients", mul(8, f.trainable_elements)});
  // Each tensor's table entry and views (names, shapes, layouts): a deck of millions of
  // small layers is mostly this.
  e.parts.push_back({"the parameter table", mul(512, f.tensors)});
  const int64_t states = c.optimizer == "sgd" ? (c.momentum > 0 ? 1 : 0) : 2;
  if (states > 0)
    e.parts.push_back(
        {"optimizer state", mul(mul(4, states), f.trainable_elements) / (fsdp ? world : 1)});
  if (kind.activation_bytes)
    e.parts.push_back({"activations of a micro-batch of " + std::to_string(c.micro_bs),
                       kind.activation_bytes(m, c.micro_bs, seq_len)});
  const int64_t data = file_bytes(c.data_file) + file_bytes(c.eval_file);
  if (data > 0) e.parts.push_back({"data_file and eval_file (read whole)", data});
  int64_t training = 0;
  for (const auto& p : e.parts) training = checked_add(training, p.second, "the memory estimate");
  // Set-up: every rank quantizes the whole base (FSDP shards it afterwards; DDP broadcasts
  // rank 0's tensor by tensor, in place), holding one weight's float32 values at a time,
  // with the dense tensors, the adapters and the optimizer state; no activations yet.
  int64_t setup = checked_add(nf4, dense, "the memory estimate");
  setup = checked_add(setup, mul(4, f.largest_nf4_elements), "the memory estimate");
  setup = checked_add(setup, mul(8 + 4 * states, f.trainable_elements), "the memory estimate");
  setup = checked_add(setup, data, "the memory estimate");
  if (setup > training) e.parts.push_back({"set-up's excess over training", setup - training});
  // What no allocation of kqlora's holds: GEMM packing buffers, MPI's and HDF5's, the
  // heap's slack. Measured on this machine at 30 - 90 MiB over the tracked peak at the 135M
  // and 1B shapes and 0.4 GiB at the 7B shape (docs/BENCHMARKS.md, "The memory estimate").
  const int64_t peak = std::max(training, setup);
  e.parts.push_back({"untracked (libraries, packing)", peak / 8 + (int64_t(64) << 20)});
  for (const auto& p : e.parts)
    e.per_rank = checked_add(e.per_rank, p.second, "the memory estimate");
  if (node_shared) e.node_shared = mul(4, f.trainable_elements) * (node - 1) / node;
  const MemoryBudget b = node_memory();
  e.budget_source = b.source;
  e.budget_per_rank = static_cast<int64_t>(0.9 * static_cast<double>(b.bytes) / node);
  return e;
}

std::string MemoryEstimate::report() const {
  std::ostringstream os;
  os << "memory estimate per rank: " << human_bytes(static_cast<double>(per_rank)) << " (";
  for (size_t i = 0; i < parts.size(); ++i)
    os << (i ? ", " : "") << parts[i].first << " "
       << human_bytes(static_cast<double>(parts[i].second));
  os << "); available: ";
  if (budget_per_rank > 0)
    os << human_bytes(static_cast<double>(budget_per_rank)) << " = 0.9 x " << budget_source << " / "
       << ranks_per_node << " rank(s) on this node";
  else
    os << "unknown";
  return os.str();
}

void check_memory(const Config& c, int world_size, int ranks_per_node, int64_t seq_len,
                  const std::string& where) {
  if (c.memory_check == "off") return;
  const MemoryEstimate e = estimate_memory(c, world_size, ranks_per_node, seq_len);
  // A node-shared copy is counted once per node: each rank's share of it.
  if (e.budget_per_rank <= 0 || e.per_rank - e.node_shared <= e.budget_per_rank) return;
  const std::string keys = model_kind(c.model).size_keys;
  KQLORA_INPUT_CHECK(false, where << ": this run does not fit in memory (" << keys
                                  << " size it): " << e.report()
                                  << "; make it smaller, spread it over more nodes (parallel = "
                                     "fsdp shards the base and the optimizer state), or set "
                                     "memory_check = off to run it anyway");
}

}  // namespace kqlora
