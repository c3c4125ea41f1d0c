#pragma once
// DDP: every rank holds the whole model. At construction rank 0's parameters -- the NF4
// components byte for byte and the float tensors, in one broadcast -- replace every rank's
// (so all ranks hold rank 0's exact bytes). In the last micro-batch's backward, gradients
// are summed over ranks in buckets of about bucket_mb, each bucket started as soon as its
// groups' gradients are complete, and driven between the panels of the products that
// follow, so the reduction overlaps the rest of the backward.
//
// Where all ranks run on one node and the model is in host memory, share_node_memory()
// replaces the buckets: the gradients, the master weights and the optimizer state move into
// memory the ranks share (MPI-3 windows); after the backward each rank sums every rank's
// gradients over its own chunk of the flat vector and updates that chunk (the optimizer
// state sharded, as ZeRO stage 1), and every rank reads the updated weights in place. No
// gradient or weight is copied between ranks, and the optimizer's work is divided by N.

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/nn/model.hpp"
#include "kqlora/optim/optimizer.hpp"
#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

template <class ExecSpace>
class Ddp {
 public:
  using Mem = typename ExecSpace::memory_space;

  Ddp(Communicator& comm, Model<ExecSpace>& model, double bucket_mb, bool overlap = true);
  ~Ddp();

  /// Rank 0's base weights and parameters on every rank (one broadcast).
  void broadcast_parameters();

  /// After broadcast_parameters(), collective: the node-shared mode described above, with
  /// state buffers for an optimizer of `opt`. False (and nothing changed) where the ranks
  /// cannot share memory; buckets are used then. `fill`: this rank's chunk of the shared
  /// weights gets the model's values, its gradients and optimizer state zeros (a fresh
  /// run); false: the caller fills the chunk and the state and calls updated() (a
  /// restart reads them from its checkpoint), the gradients are left unwritten (a step's
  /// first backward writes them).
  bool share_node_memory(const OptimizerConfig& opt, bool fill = true);
  bool shares_memory() const { return shared_ != nullptr; }
  /// The part of the flat parameters this rank's optimizer updates: all of them, or in the
  /// node-shared mode its chunk [chunk_offset, chunk_offset + chunk_size).
  int64_t chunk_offset() const;
  int64_t chunk_size() const;
  /// Buffers for the optimizer's state over this rank's chunk (node-shared mode).
  std::vector<typename Model<ExecSpace>::Vec> optimizer_buffers() const;
  /// The whole optimizer state by name (node-shared mode: every rank's chunks together).
  std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>> optimizer_state(
      const Optimizer<ExecSpace>& opt) const;

  /// Before the last micro-batch's backward: its group hooks start the buckets.
  void arm();
  /// After that backward: starts what is left, waits for all buckets (node-shared mode:
  /// waits for every rank's backward and sums its chunk of the gradients).
  void finish();
  /// L2 norm of the summed gradients (after finish()).
  double grad_norm(const ExecSpace& exec);
  /// After the optimizer has updated this rank's chunk (or skipped the step): node-shared
  /// mode waits until every rank has, so the weights are whole again.
  void updated();

  /// The model is not used after this Ddp: in the node-shared mode its weights and
  /// gradients go with the shared memory instead of being copied back into private
  /// buffers at destruction (a trainer about to return; saves touching 2 x 4 bytes per
  /// parameter per rank).
  void keep_nothing_for_model() { copy_back_ = false; }

  struct Stats {
    double in_flight_s = 0;  // summed lifetime of the bucket reductions
    double waited_s = 0;     // time blocked in finish()
    double bytes = 0;
    int buckets = 0;
    double sum_s = 0;  // node-shared mode: summing the chunks
  };
  const Stats& stats() const { return stats_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int64_t lo = 0, hi = 0;  // flat gradient range
    int groups = 0;          // parameter groups in it
    int pending = 0;
    std::unique_ptr<Request> request;
    std::chrono::steady_clock::time_point started;
    bool finished = false;
  };
  Communicator& comm_;
  Model<ExecSpace>& model_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_group_;  // -1: a group without trainable parameters
  bool armed_ = false, overlap_ = true, copy_back_ = true;
  Stats stats_;
  Kokkos::View<float*, Kokkos::HostSpace> staging_;  // device gradients through the host
  // Node-shared mode: every rank's gradients (rows of padded_ floats), the master weights
  // and each optimizer state (chunks end to end).
  std::unique_ptr<SharedMemory> shared_, shared_params_;
  std::vector<std::unique_ptr<SharedMemory>> shared_state_;
  std::vector<std::string> state_names_;
  int64_t chunk_ = 0, padded_ = 0;
  double chunk_sum_squares_ = 0;

  bool staged() const;    // device gradients through host memory (a host-memory backend)
  float* grads_buffer();  // what the reductions read and write
  void start(Bucket& b);
  void progress();
};

}  // namespace kqlora
