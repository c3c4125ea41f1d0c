#pragma once
// A training run's checkpoints behind one interface: HDF5 checkpoints (docs/CHECKPOINTS.md)
// in builds with HDF5, and in builds without it an implementation that refuses a restart
// or checkpoint_every and writes nothing (so the training loop has no build branches).

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include "kqlora/nn/model.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/parallel/data_parallel.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

template <class ExecSpace>
class RunCheckpoints {
 public:
  virtual ~RunCheckpoints() = default;

  /// restart = latest | PATH: opens the checkpoint, checks it against the deck (the same
  /// model, dtype, NF4 block sizes and optimizer; errors list what differs), fills the
  /// model's frozen tensors and returns the step it holds.
  virtual int64_t open_restart(Model<ExecSpace>& model) = 0;
  /// Once the model holds its whole frozen base (initialised or restarted, before FSDP
  /// shards it): with checkpoint_base = auto, a Hugging Face model's checkpoints store
  /// this base's identity (io/base_hash.hpp) instead of its tensors.
  virtual void note_base(const Model<ExecSpace>& model) { (void)model; }
  /// A preference objective's reference (train/preference_loss.hpp): the hash of the
  /// adapters the run started from, written into its checkpoints; a restart's must be the
  /// checkpoint's (InputError naming both: another init_file or seed).
  virtual void note_reference(const std::string& hash) { (void)hash; }
  /// After the data-parallel set-up: this rank's parameters and optimizer state read
  /// straight into where they live, then dp.after_restore(); the files are closed.
  virtual void restore_state(Model<ExecSpace>& model, DataParallel<ExecSpace>& dp,
                             Optimizer<ExecSpace>& opt) = 0;
  /// Writes and commits the checkpoint of `steps_done` steps (collective). Returns its
  /// directory, or "" where nothing was written.
  virtual std::string save(Model<ExecSpace>& model, DataParallel<ExecSpace>& dp,
                           const Optimizer<ExecSpace>& opt, int64_t steps_done,
                           const std::string& data_source) = 0;
};

/// The run's checkpoints; InputError where the deck asks for what this build cannot do.
template <class ExecSpace>
std::unique_ptr<RunCheckpoints<ExecSpace>> make_run_checkpoints(const Config& cfg,
                                                                Communicator& comm,
                                                                std::ostream& log);

}  // namespace kqlora
