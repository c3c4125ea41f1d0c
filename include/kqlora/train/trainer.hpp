#pragma once
// The training loop of kqlora-train, top to bottom per step: data, forward, loss,
// backward, gradient reduction over ranks, gradient norm (non-finite check, clipping),
// optimizer update, logging, evaluation, checkpoint.

#include <iosfwd>
#include <string>
#include <vector>

#include "kqlora/parallel/communicator.hpp"
#include "kqlora/quant/nf4_tensor.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

struct TrainSummary {
  std::vector<double> losses;  // per step (NaN for a skipped step)
  int64_t steps_done = 0, steps_skipped = 0;
  int64_t steps_empty = 0;  // skipped: no scored label in the global batch (token data)
  std::string last_checkpoint;
  /// A stop signal (SIGTERM, SIGUSR1 on any rank) ended the run early, after a checkpoint.
  bool preempted = false;
  /// With `collect_final`: the final model, whole (FSDP shards gathered), on every rank.
  std::vector<std::pair<std::string, Nf4Tensor<Kokkos::HostSpace>>> final_base;
  std::vector<std::pair<std::string, std::vector<float>>> final_params;
};

/// Runs the configured training on every rank of the run; progress goes to `log` on rank 0.
/// Throws InputError for bad input and Error for failures (a non-finite loss with
/// nonfinite = stop among them).
TrainSummary train(const Config& cfg, std::ostream& log);
/// The same over a given communicator (tests run a reference over MPI_COMM_SELF).
TrainSummary train(const Config& cfg, Communicator& comm, std::ostream& log,
                   bool collect_final = false);
/// The communicator the deck asks for (comm = auto|mpi|nccl) over all ranks of the run.
std::unique_ptr<Communicator> make_communicator(const Config& cfg, std::string* note = nullptr);

}  // namespace kqlora
