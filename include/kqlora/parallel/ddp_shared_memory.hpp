#pragma once
// DDP through node shared memory: where all ranks run on one node and the model is in
// host memory, the gradients, the master weights and the optimizer state live in memory
// the ranks share (MPI-3 windows). After the backward each rank sums every rank's
// gradients over its own chunk of the flat vector and updates that chunk (the optimizer
// state sharded, as ZeRO stage 1), and every rank reads the updated weights in place. No
// gradient or weight is copied between ranks, and the optimizer's work is divided by N.

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>
#include <vector>

#include "kqlora/parallel/data_parallel.hpp"

namespace kqlora {

template <class ExecSpace>
class DdpSharedMemory : public DataParallel<ExecSpace> {
 public:
  using typename DataParallel<ExecSpace>::Mem;
  using typename DataParallel<ExecSpace>::Vec;
  using typename DataParallel<ExecSpace>::NamedVecs;

  /// Collective, after every rank holds rank 0's model: the shared mode with state buffers
  /// for an optimizer of `opt`, or null (on every rank) where the ranks cannot share
  /// memory. `fill`: this rank's chunk of the shared weights gets the model's values, its
  /// gradients and optimizer state zeros (a fresh run); false: the caller fills the chunk
  /// and the state, then calls after_restore() (a restart), and the gradients are left
  /// unwritten (a step's first backward writes them).
  static std::unique_ptr<DdpSharedMemory> create(Communicator& comm, Model<ExecSpace>& model,
                                                 const OptimizerConfig& opt, bool fill);
  ~DdpSharedMemory() override;

  std::string name() const override { return "ddp (node shared memory)"; }
  int64_t chunk_offset() const override;
  Vec chunk_params() const override;
  Vec chunk_grads() const override;
  Optimizer<ExecSpace> make_optimizer(const ExecSpace& exec,
                                      const OptimizerConfig& cfg) const override;
  NamedVecs optimizer_state(const Optimizer<ExecSpace>& opt) const override;
  /// Waits for every rank's backward and sums this rank's chunk of the gradients.
  void reduce_gradients() override;
  double grad_norm(const ExecSpace& exec) override;
  /// Waits until every rank has updated its chunk (or skipped the step).
  void after_update(bool updated) override;
  Nf4Tensor<Mem> whole_nf4(int i) override { return model_.nf4[i]; }
  void report(std::ostream& log, int64_t steps) const override;
  /// The model's weights and gradients go with the shared memory instead of being copied
  /// back into private buffers at destruction (saves touching 2 x 4 bytes per parameter).
  void keep_nothing_for_model() override { copy_back_ = false; }

 private:
  DdpSharedMemory(Communicator& comm, Model<ExecSpace>& model) : comm_(comm), model_(model) {}
  int64_t chunk_size() const;

  Communicator& comm_;
  Model<ExecSpace>& model_;
  // Every rank's gradients (rows of padded_ floats), the master weights and each optimizer
  // state (chunks end to end).
  std::unique_ptr<SharedMemory> grads_, params_;
  std::vector<std::unique_ptr<SharedMemory>> state_;
  std::vector<std::string> state_names_;
  int64_t chunk_ = 0, padded_ = 0;
  double chunk_sum_squares_ = 0, waited_s_ = 0, sum_s_ = 0, bytes_ = 0;
  bool copy_back_ = true;
};

}  // namespace kqlora
