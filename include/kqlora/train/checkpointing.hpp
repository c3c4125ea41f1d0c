#pragma once
// Checkpoints of a training run (HDF5 builds): writing the state in the deck's layout,
// and a restart's loading, checking and restoring of it.

#include <iosfwd>
#include <string>

#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/checkpoint_reader.hpp"
#include "kqlora/nn/model.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/parallel/data_parallel.hpp"
#include "kqlora/train/config.hpp"

namespace kqlora {

/// The checkpoint a restart resumes from: `latest` in save_dir or a path (any layout,
/// world size and parallel mode), opened with its values left in the file; refuses
/// another model, dtype, NF4 block sizes or optimizer, listing what differs. Notes itself
/// on `log`.
CheckpointReader load_restart(const Config& cfg, std::ostream& log);

/// The checkpoint's frozen tensors (NF4 and dense) into the model (whole, before any
/// sharding).
template <class ExecSpace>
void restore_frozen(Model<ExecSpace>& model, const CheckpointReader& c);

/// The model's NF4 tensors, copied to the host (e.g. as quantized from the model's files).
template <class ExecSpace>
std::vector<Nf4Tensor<Kokkos::HostSpace>> nf4_snapshot(const Model<ExecSpace>& model);
/// InputError naming every NF4 tensor whose bytes differ from `before` (a restart whose
/// model directory or init_file no longer gives the base the checkpoint was trained on).
template <class ExecSpace>
void check_same_base(const Model<ExecSpace>& model,
                     const std::vector<Nf4Tensor<Kokkos::HostSpace>>& before,
                     const std::string& source, const std::string& checkpoint);

/// Parameters [first, first + dst.extent(0)) of the flat vector (clipped to it) from the
/// checkpoint into dst, read straight into it where dst is host memory. Returns the
/// seconds spent placing dst's pages (first touch) before the reading.
template <class ExecSpace>
double restore_params(const Model<ExecSpace>& model, const CheckpointReader& c, int64_t first,
                      const typename Model<ExecSpace>::Vec& dst);

/// The optimizer state of parameters [first, first + size) of the flat vector (the whole
/// vector for DDP, this rank's chunk for FSDP and node-shared DDP) and the step count.
/// Returns the seconds of first touch, as restore_params.
template <class ExecSpace>
double restore_optimizer(Optimizer<ExecSpace>& opt, const Model<ExecSpace>& model,
                         const CheckpointReader& c, int64_t first);

/// Writes and commits the checkpoint of `steps_done` steps in cfg.checkpoint_layout
/// (collective); returns the step directory. `opt_state`: the optimizer's state by name,
/// over this rank's FSDP chunk or (DDP) the whole flat vector (dp.optimizer_state).
/// `base_hash` non-empty: the frozen tensors are not written, the hash is (root attribute
/// base_hash; checkpoint_base = auto).
template <class ExecSpace>
std::string save_checkpoint(
    const Config& cfg, Model<ExecSpace>& model, const Optimizer<ExecSpace>& opt,
    const std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>>& opt_state,
    const DataParallel<ExecSpace>& dp, Communicator& comm, int64_t steps_done,
    const std::string& data_source, const std::string& base_hash = "",
    const std::string& reference_hash = "");

/// The identity of the model's whole frozen base (io/base_hash.hpp).
template <class ExecSpace>
std::string model_base_hash(const Model<ExecSpace>& model);

}  // namespace kqlora
