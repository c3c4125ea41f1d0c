#pragma once
// DDP with bucketed reductions: every rank holds the whole model. In the last
// micro-batch's backward, gradients are summed over ranks in buckets of about bucket_mb,
// each started as soon as its parameter groups' gradients are complete: blocking at once
// (overlap false: the default with host memory, where the reduction's arithmetic runs on
// the cores that compute anyway), or non-blocking, driven between the panels of the
// products that follow and finished after the backward (overlap true: the default with
// device memory, where the work leaves the compute stream).

#include <Kokkos_Core.hpp>

#include <chrono>
#include <memory>
#include <vector>

#include "kqlora/parallel/data_parallel.hpp"

namespace kqlora {

template <class ExecSpace>
class DdpBuckets : public DataParallel<ExecSpace> {
 public:
  using typename DataParallel<ExecSpace>::Mem;
  using typename DataParallel<ExecSpace>::Vec;

  DdpBuckets(Communicator& comm, Model<ExecSpace>& model, double bucket_mb, bool overlap);
  ~DdpBuckets() override;

  std::string name() const override { return "ddp (buckets)"; }
  Vec chunk_params() const override { return model_.params; }
  Vec chunk_grads() const override { return model_.grads; }
  /// Its group hooks start the buckets.
  void before_last_backward() override;
  /// Starts what is left and waits for every bucket.
  void reduce_gradients() override;
  double grad_norm(const ExecSpace& exec) override;
  void after_update(bool updated) override;
  Nf4Tensor<Mem> whole_nf4(int i) override { return model_.nf4[i]; }
  void report(std::ostream& log, int64_t steps) const override;

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
  bool armed_ = false, overlap_ = true;
  double in_flight_s_ = 0, waited_s_ = 0, bytes_ = 0;
  Kokkos::View<float*, Kokkos::HostSpace> staging_;  // device gradients through the host

  bool staged() const;    // device gradients through host memory (a host-memory backend)
  float* grads_buffer();  // what the reductions read and write
  void start(Bucket& b);
  void progress();
};

}  // namespace kqlora
