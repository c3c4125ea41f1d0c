#include "kqlora/train/memory_check.hpp"

#include <sys/stat.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <sstream>
#include <type_traits>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/gpu_device.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/memory_budget.hpp"
#include "kqlora/nn/decoder_buffers.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/parallel/nccl_communicator.hpp"
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

MemoryPlacement build_placement(int ranks_per_device, bool nccl, bool device_collectives) {
  MemoryPlacement p;
  p.device = !std::is_same<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>::value;
  if (!p.device) return p;
  p.ranks_per_device = std::max(ranks_per_device, 1);
  p.device_free = gpu_free_memory(gpu_ordinal());
  p.nccl = nccl;
  p.device_collectives = device_collectives;
  return p;
}

MemoryEstimate estimate_memory(const Config& c, int world_size, int ranks_per_node, int64_t seq_len,
                               const MemoryPlacement& where) {
  const ModelConfig m = model_config(c);
  const ModelKind& kind = model_kind(m.kind);
  const ModelFootprint f = model_footprint(m);
  const bool fsdp = c.parallel == "fsdp", device = where.device;
  // Node-shared DDP: the trainable weights are one copy per node (parallel/ddp_shared_memory),
  // which every rank maps and reads whole (its RSS counts all of it); the frozen base is
  // each rank's own. (Host memory only: a device run keeps its own copy.)
  const bool node_shared = !device && !fsdp && c.ddp_shared_memory != "off" && ranks_per_node > 1;
  const int64_t world = std::max(world_size, 1), node = std::max(ranks_per_node, 1);
  MemoryEstimate e;
  e.ranks_per_node = ranks_per_node;
  // The model's tensors, optimizer state and activations: on the GPU in a device run.
  auto& model_parts = device ? e.device_parts : e.parts;
  // NF4: half a byte per element, a scaler byte per block, a float per scaler block.
  const int64_t nf4 = f.nf4_elements / 2 + f.nf4_elements / m.block_size +
                      mul(4, f.nf4_elements / m.block_size / m.scaler_block_size + 1);
  // (float32 values; compact ones bfloat16)
  const int64_t dense = checked_add(mul(4, f.dense_elements - f.compact_dense_elements),
                                    mul(2, f.compact_dense_elements), "the memory estimate");
  model_parts.push_back({"frozen NF4 base", fsdp ? nf4 / world : nf4});
  if (dense > 0) model_parts.push_back({"frozen dense tensors", dense});
  model_parts.push_back({"trainable parameters and gradients", mul(8, f.trainable_elements)});
  // Each tensor's table entry and views (names, shapes, layouts): a deck of millions of
  // small layers is mostly this.
  e.parts.push_back({"the parameter table", mul(512, f.tensors)});
  const int64_t states = c.optimizer == "sgd" ? (c.momentum > 0 ? 1 : 0) : 2;
  if (states > 0)
    model_parts.push_back(
        {"optimizer state", mul(mul(4, states), f.trainable_elements) / (fsdp ? world : 1)});
  if (kind.activation_bytes) {
    // (a causal_lm's bfloat16 run on a GPU keeps them in 16 bits unless told otherwise)
    const auto& keys = kind.deck_keys;
    const bool kept16 = std::find(keys.begin(), keys.end(), "activation_dtype") != keys.end() &&
                        keeps_bf16_activations<Kokkos::DefaultExecutionSpace::memory_space>(m);
    // (a preference objective's micro-batch is micro_bs pairs: twice the rows)
    const int64_t rows = c.objective == "sft" ? c.micro_bs : 2 * c.micro_bs;
    model_parts.push_back({"activations of a micro-batch of " + std::to_string(rows) +
                               (c.objective == "sft" ? "" : " rows (pairs)") +
                               (kept16 ? " (kept in bfloat16)" : ""),
                           kind.activation_bytes(m, rows, seq_len)});
  }
  if (c.objective == "dpo")  // (the frozen reference's adapters, and their rounding)
    model_parts.push_back(
        {"the preference reference's adapters", mul(m.bf16() ? 8 : 4, f.trainable_elements)});
  const int64_t data = file_bytes(c.data_file) + file_bytes(c.eval_file);
  if (data > 0) e.parts.push_back({"data_file and eval_file (read whole)", data});
  // Set-up: every rank quantizes the whole base (FSDP shards it afterwards; DDP broadcasts
  // rank 0's tensor by tensor, in place), holding one weight's float32 values at a time,
  // with the dense tensors, the adapters and the optimizer state; no activations yet.
  int64_t setup = checked_add(nf4, dense, "the memory estimate");
  setup = checked_add(setup, mul(4, f.largest_nf4_elements), "the memory estimate");
  setup = checked_add(setup, mul(8 + 4 * states, f.trainable_elements), "the memory estimate");
  if (!device) setup = checked_add(setup, data, "the memory estimate");
  int64_t training = 0;
  for (const auto& p : model_parts)
    training = checked_add(training, p.second, "the memory estimate");
  if (!device && fsdp && world > 1) {
    // FSDP on the host: a group's NF4 gathered whole around its products (a layer's: with
    // experts, hundreds of tensors), and the padded parameter and gradient vectors and the
    // chunk's gradients beside the model (parallel/fsdp).
    const int64_t g = f.largest_group_nf4_elements;
    const int64_t trainable4 = mul(4, f.trainable_elements);
    const int64_t padded =
        checked_add(mul(2, trainable4), trainable4 / world, "the memory estimate");
    const int64_t fsdp_bytes =
        checked_add(g / 2 + g / m.block_size + mul(4, g / m.block_size / m.scaler_block_size + 1),
                    padded, "the memory estimate");
    e.parts.push_back({"FSDP's gathered layer and padded vectors", fsdp_bytes});
    training = checked_add(training, fsdp_bytes, "the memory estimate");
    // (the padded vectors are made while the whole base, quantized by every rank, still is)
    setup = checked_add(setup, padded, "the memory estimate");
  }
  if (!device) {
    if (setup > training) e.parts.push_back({"set-up's excess over training", setup - training});
    // What no allocation of kqlora's holds: GEMM packing buffers, MPI's and HDF5's, the
    // heap's slack. Measured on this machine at 30 - 90 MiB over the tracked peak at the
    // 135M and 1B shapes and 0.4 GiB at the 7B shape (docs/BENCHMARKS.md, "The memory
    // estimate").
    e.parts.push_back(
        {"untracked (libraries, packing)", std::max(training, setup) / 8 + (int64_t(64) << 20)});
  } else {
    // Set-up's bfloat16 copy of the weight being quantized sits beside its float32 values.
    setup = checked_add(setup, mul(2, f.largest_nf4_elements), "the memory estimate");
    if (setup > training)
      e.device_parts.push_back({"set-up's excess over training", setup - training});
    // Beside the tensors: cuBLAS' workspace, NCCL's bounded staging buffer, and an eighth
    // for the allocator's rounding and Kokkos' scratch. (The CUDA context and NCCL's own
    // buffers are out of the free memory already: it is read after they exist, and after
    // a warm-up of the run's collectives for the buffers NCCL makes at their first use,
    // nccl_warm_up.)
    int64_t libraries = int64_t(64) << 20;
    if (where.nccl) libraries += kNcclStagingBytes;
    e.device_parts.push_back({"CUDA libraries (cuBLAS workspace, NCCL staging)", libraries});
    e.device_parts.push_back(
        {"untracked (allocator rounding, scratch)", std::max(training, setup) / 8});
    // The host's part: the weights read from disk pass through a float32 and a file-dtype
    // buffer; collectives the communicator cannot run on device buffers go through host
    // copies (DDP's gradients; FSDP's parameter, gradient and NF4 gathers, parallel/fsdp).
    int64_t staging = mul(6, f.largest_nf4_elements);
    const int64_t trainable4 = mul(4, f.trainable_elements);
    if (fsdp && world > 1) {
      // FSDP's padded parameter and gradient vectors and its chunk's gradients live beside
      // the model; without device collectives they and a gathered weight pass through host
      // copies as well.
      const int64_t padded =
          checked_add(mul(2, trainable4), trainable4 / world, "the memory estimate");
      e.device_parts.push_back({"FSDP's padded parameters and gradients", padded});
      if (!where.device_collectives) {
        staging = checked_add(staging, padded, "the memory estimate");
        staging = checked_add(
            staging, mul(2, f.largest_nf4_elements / 2 + f.largest_nf4_elements / m.block_size),
            "the memory estimate");
      }
    } else if (world > 1 && !where.device_collectives) {
      staging = checked_add(staging, trainable4, "the memory estimate");
    }
    if (where.nccl) staging = checked_add(staging, 2 * kNcclStagingBytes, "the memory estimate");
    e.parts.push_back({"host staging (set-up reads, collectives)", staging});
    int64_t host = 0;
    for (const auto& p : e.parts) host = checked_add(host, p.second, "the memory estimate");
    // The CUDA runtime's and the libraries' host memory, MPI's and HDF5's, the heap's slack.
    e.parts.push_back({"untracked (CUDA runtime, libraries)", host / 8 + (int64_t(256) << 20)});
  }
  for (const auto& p : e.parts)
    e.per_rank = checked_add(e.per_rank, p.second, "the memory estimate");
  for (const auto& p : e.device_parts)
    e.device_per_rank = checked_add(e.device_per_rank, p.second, "the memory estimate");
  if (node_shared) e.node_shared = mul(4, f.trainable_elements) * (node - 1) / node;
  const MemoryBudget b = node_memory();
  e.budget_source = b.source;
  e.budget_per_rank = static_cast<int64_t>(0.9 * static_cast<double>(b.bytes) / node);
  if (device) {
    e.ranks_per_device = std::max(where.ranks_per_device, 1);
    e.device_budget_source = where.device_free.source;
    e.device_budget_per_rank = static_cast<int64_t>(
        0.9 * static_cast<double>(where.device_free.bytes) / e.ranks_per_device);
  }
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
  if (device_parts.empty()) return os.str();
  os << "\nGPU memory estimate per rank: " << human_bytes(static_cast<double>(device_per_rank))
     << " (";
  for (size_t i = 0; i < device_parts.size(); ++i)
    os << (i ? ", " : "") << device_parts[i].first << " "
       << human_bytes(static_cast<double>(device_parts[i].second));
  os << "); available: ";
  if (device_budget_per_rank > 0)
    os << human_bytes(static_cast<double>(device_budget_per_rank)) << " = 0.9 x "
       << device_budget_source << " / " << ranks_per_device << " rank(s) on this GPU";
  else
    os << "unknown";
  return os.str();
}

void check_memory(const Config& c, int world_size, int ranks_per_node, int64_t seq_len,
                  const std::string& where, const MemoryPlacement& placement) {
  if (c.memory_check == "off") return;
  const MemoryEstimate e = estimate_memory(c, world_size, ranks_per_node, seq_len, placement);
  // A node-shared copy is counted once per node: each rank's share of it.
  const bool host_fits = e.budget_per_rank <= 0 || e.per_rank - e.node_shared <= e.budget_per_rank;
  const bool device_fits =
      e.device_budget_per_rank <= 0 || e.device_per_rank <= e.device_budget_per_rank;
  if (host_fits && device_fits) return;
  const std::string keys = model_kind(c.model).size_keys;
  KQLORA_INPUT_CHECK(false, where << ": this run does not fit in "
                                  << (device_fits ? "memory" : "GPU memory") << " (" << keys
                                  << " size it): " << e.report()
                                  << "; make it smaller, spread it over more nodes (parallel = "
                                     "fsdp shards the base and the optimizer state), or set "
                                     "memory_check = off to run it anyway");
}

}  // namespace kqlora
