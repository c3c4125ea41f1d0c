#pragma once
// The data-parallel interface the trainer holds: one strategy per run, chosen by
// make_data_parallel from the deck's parallel, ddp_shared_memory and ddp_overlap keys
// (docs/TRAINING.md, "Data parallelism"). Implementations: SingleProcess (one rank),
// DdpBuckets (gradients summed in buckets during the backward), DdpSharedMemory (ranks of
// one node share gradients, weights and optimizer state), FsdpSharding (NF4 weights and
// parameter chunks sharded). A step, for every strategy:
//   before_last_backward(); model.forward_backward(...); reduce_gradients();
//   norm = grad_norm(); optimizer on chunk_params()/chunk_grads(); after_update(ran).

#include <Kokkos_Core.hpp>

#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/nn/model.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/quant/nf4_shard.hpp"

namespace kqlora {

template <class ExecSpace>
class DataParallel {
 public:
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;
  using NamedVecs = std::vector<std::pair<std::string, Vec>>;

  virtual ~DataParallel() = default;

  /// "single process", "ddp (buckets)", "ddp (node shared memory)", "fsdp".
  virtual std::string name() const = 0;
  /// Whether a step communicates (the trainer times that part apart).
  virtual bool communicates() const { return true; }

  /// The part of the flat parameters this rank's optimizer updates: elements
  /// [chunk_offset(), chunk_offset() + chunk_params().extent(0)), and their gradients.
  virtual int64_t chunk_offset() const { return 0; }
  virtual Vec chunk_params() const = 0;
  virtual Vec chunk_grads() const = 0;
  /// The optimizer over the chunk, its state where the strategy keeps it.
  virtual Optimizer<ExecSpace> make_optimizer(const ExecSpace& exec,
                                              const OptimizerConfig& cfg) const {
    return Optimizer<ExecSpace>(exec, cfg, chunk_params().extent(0));
  }
  /// The whole optimizer state by name, over chunk_offset().. as the checkpoint writes it
  /// (node shared memory: every rank's chunks together).
  virtual NamedVecs optimizer_state(const Optimizer<ExecSpace>& opt) const { return opt.state(); }

  /// Before the step's last micro-batch's backward.
  virtual void before_last_backward() {}
  /// After the backward: the gradients of the global batch where the optimizer reads them.
  virtual void reduce_gradients() {}
  /// L2 norm of the global batch's gradients (after reduce_gradients).
  virtual double grad_norm(const ExecSpace& exec) = 0;
  /// After the optimizer ran on the chunk (`updated`) or the step was skipped: every
  /// rank's model holds the step's weights.
  virtual void after_update(bool updated) = 0;
  /// After a restart filled this rank's chunk and its optimizer state.
  virtual void after_restore() { after_update(true); }

  /// FSDP: this rank's shards of the model's NF4 tensors (by ParamEntry::offset); else null.
  virtual const std::vector<Nf4Shard<Mem>>* nf4_shards() const { return nullptr; }
  /// NF4 tensor i whole (collective under FSDP).
  virtual Nf4Tensor<Mem> whole_nf4(int i) = 0;

  /// A line for the log after set-up (may be empty), and the statistics after the run.
  virtual void describe(std::ostream& log) const { (void)log; }
  virtual void report(std::ostream& log, int64_t steps) const { (void)log, (void)steps; }
  /// The model is not used after this strategy (a trainer about to return).
  virtual void keep_nothing_for_model() {}
};

enum class Switch { automatic, on, off };
Switch parse_switch(const std::string& value, const std::string& key);

struct DataParallelConfig {
  std::string parallel = "ddp";  // ddp | fsdp
  Switch shared_memory = Switch::automatic, overlap = Switch::automatic;
  double bucket_mb = 25;
  /// At world size 1: the single-process strategy (true), or DDP's bucketed reductions
  /// through the communicator as at any size (false: `single_process = off`, e.g. to run
  /// NCCL's collectives on a one-GPU machine). FSDP runs at any size either way.
  bool single_process = true;
  OptimizerConfig optimizer;
  /// A fresh run (rank 0's initial weights go to every rank); false: a restart, which
  /// fills every rank's chunk itself and then calls after_restore().
  bool fresh = true;
};

/// The strategy the configuration asks for over `comm` (collective). The environment
/// variables KQLORA_DDP_SHARED_MEMORY and KQLORA_DDP_OVERLAP (0 or 1) override the keys,
/// with a line on `log` (rank 0).
template <class ExecSpace>
std::unique_ptr<DataParallel<ExecSpace>> make_data_parallel(const ExecSpace& exec,
                                                            Communicator& comm,
                                                            Model<ExecSpace>& model,
                                                            DataParallelConfig cfg,
                                                            std::ostream& log);

}  // namespace kqlora
