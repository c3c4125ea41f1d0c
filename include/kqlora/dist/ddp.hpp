#pragma once
// DDP: every rank holds the whole model. At construction rank 0's parameters -- the NF4
// components byte for byte and the float tensors, in one broadcast -- replace every rank's
// (so all ranks hold rank 0's exact bytes). In the last micro-batch's backward, gradients
// are summed over ranks in buckets of about bucket_mb, each bucket started as soon as its
// layers' gradients are complete, and driven between the panels of the products that
// follow, so the reduction overlaps the rest of the backward.

#include <Kokkos_Core.hpp>

#include <memory>
#include <vector>

#include "kqlora/dist/communicator.hpp"
#include "kqlora/nn/lora_model.hpp"

namespace kqlora {

template <class ExecSpace>
class Ddp {
 public:
  using Mem = typename ExecSpace::memory_space;

  Ddp(dist::Communicator& comm, LoraModel<ExecSpace>& model, double bucket_mb, bool overlap = true);
  ~Ddp();

  /// Rank 0's base weights and parameters on every rank (one broadcast).
  void broadcast_parameters();

  /// Before the last micro-batch's backward: its layer hooks start the buckets.
  void arm();
  /// After that backward: starts what is left, waits for all buckets.
  void finish();

  struct Stats {
    double in_flight_s = 0;  // summed lifetime of the bucket reductions
    double waited_s = 0;     // time blocked in finish()
    double bytes = 0;
    int buckets = 0;
  };
  const Stats& stats() const { return stats_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int64_t lo = 0, hi = 0;  // flat gradient range
    int first_layer = 0, last_layer = 0;
    int pending = 0;
    std::unique_ptr<dist::Request> request;
    std::chrono::steady_clock::time_point started;
    bool finished = false;
  };
  dist::Communicator& comm_;
  LoraModel<ExecSpace>& model_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_layer_;
  bool armed_ = false, overlap_ = true;
  Stats stats_;
  Kokkos::View<float*, Kokkos::HostSpace> staging_;  // device gradients through the host

  float* grads_host();
  void start(Bucket& b);
  void progress();
};

}  // namespace kqlora
