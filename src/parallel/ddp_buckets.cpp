#include "kqlora/parallel/ddp_buckets.hpp"

#include <iomanip>
#include <ostream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/seconds_since.hpp"

namespace kqlora {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

template <class ExecSpace>
DdpBuckets<ExecSpace>::DdpBuckets(Communicator& comm, Model<ExecSpace>& model, double bucket_mb,
                                  bool overlap)
    : comm_(comm),
      model_(model),
      overlap_(overlap &&
               (std::is_same<Mem, Kokkos::HostSpace>::value || comm.nonblocking_device_buffers())) {
  const ParamTable& t = model.table();
  // Buckets gather groups from the last (whose gradients are ready first) down, each at
  // least bucket_mb of one contiguous range of the flat gradients.
  const int64_t target = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20) / 4));
  bucket_of_group_.assign(t.num_groups(), -1);
  for (int g = t.num_groups() - 1; g >= 0; --g) {
    const auto range = t.trainable_range(g);
    if (range.first == range.second) continue;  // nothing to sum (its backward has no hook)
    if (buckets_.empty() || buckets_.back().hi - buckets_.back().lo >= target ||
        buckets_.back().lo != range.second) {
      buckets_.emplace_back();
      buckets_.back().hi = range.second;
    }
    Bucket& b = buckets_.back();
    b.lo = range.first;
    ++b.groups;
    bucket_of_group_[g] = static_cast<int>(buckets_.size()) - 1;
  }
  model_.set_backward_hooks(
      [this](int group) {
        if (!armed_ || bucket_of_group_[group] < 0) return;
        Bucket& b = buckets_[bucket_of_group_[group]];
        // A bucket goes as soon as it is complete where the communicator reads the
        // gradients where they are (host memory, or device memory with NCCL: its stream
        // waits for the compute stream); device gradients staged through the host for MPI
        // wait for reduce_gradients().
        if (--b.pending == 0 && !staged()) start(b);
        progress();
      },
      [this] {
        if (armed_) progress();
      });
}

template <class ExecSpace>
DdpBuckets<ExecSpace>::~DdpBuckets() {
  model_.set_backward_hooks({}, {});
}

template <class ExecSpace>
bool DdpBuckets<ExecSpace>::staged() const {
  return !std::is_same<Mem, Kokkos::HostSpace>::value && !comm_.device_buffers();
}

template <class ExecSpace>
float* DdpBuckets<ExecSpace>::grads_buffer() {
  // Device gradients with a host-memory backend (MPI) go through the host once, after the
  // backward (reduce_gradients copies them in and out); otherwise they are reduced where
  // they are.
  return staged() ? staging_.data() : model_.grads.data();
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::before_last_backward() {
  armed_ = true;
  for (auto& b : buckets_) {
    b.pending = b.groups;
    b.request.reset();
    b.finished = false;
  }
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::start(Bucket& b) {
  float* g = grads_buffer();
  b.started = Clock::now();
  bytes_ += 4.0 * (b.hi - b.lo);
  if (overlap_) {
    b.request = comm_.allreduce_sum(g + b.lo, b.hi - b.lo);
    return;
  }
  // Blocking, as soon as the bucket is ready: all of its time is exposed.
  comm_.allreduce_sum_blocking(g + b.lo, b.hi - b.lo);
  const double t = seconds_since(b.started);
  in_flight_s_ += t;
  waited_s_ += t;
  b.finished = true;
  b.request = std::make_unique<Request>();
  b.request->done = true;
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::progress() {
  for (auto& b : buckets_) {
    if (b.request && !b.finished && comm_.test(*b.request)) {
      b.finished = true;
      in_flight_s_ += seconds_since(b.started);
    }
  }
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::reduce_gradients() {
  KQLORA_CHECK(armed_, "DdpBuckets::reduce_gradients without before_last_backward");
  armed_ = false;
  const auto t0 = Clock::now();
  if (staged()) {
    if (staging_.extent(0) != model_.grads.extent(0))
      staging_ = Kokkos::View<float*, Kokkos::HostSpace>("kqlora::DdpBuckets::staging",
                                                         model_.grads.extent(0));
    // On the model's instance (no device-wide sync), complete before MPI reads the host copy.
    Kokkos::deep_copy(model_.exec(), staging_, model_.grads);
    fence(model_.exec(), "kqlora::DdpBuckets::stage_gradients");
  }
  for (auto& b : buckets_)
    if (!b.request) start(b);  // no overlap, or a group without a hook call
  for (auto& b : buckets_) {
    if (b.finished) continue;
    comm_.wait(*b.request);
    b.finished = true;
    in_flight_s_ += seconds_since(b.started);
  }
  waited_s_ += seconds_since(t0);
  // (ordered before the update's kernels on the same instance; staging_ is next written
  // by the next step's copy on it, after this one)
  if (staged()) Kokkos::deep_copy(model_.exec(), model_.grads, staging_);
}

template <class ExecSpace>
double DdpBuckets<ExecSpace>::grad_norm(const ExecSpace& exec) {
  return kqlora::grad_norm(exec, model_.grads);
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::after_update(bool updated) {
  if (updated) model_.params_changed();
}

template <class ExecSpace>
void DdpBuckets<ExecSpace>::report(std::ostream& log, int64_t steps) const {
  const bool device = !std::is_same<Mem, Kokkos::HostSpace>::value;
  log << "DDP: " << num_buckets() << " bucket(s) per step ("
      << (overlap_   ? "non-blocking, during the backward"
          : staged() ? "staged through host memory after the backward"
          : device   ? "device pointers in blocking MPI calls: the MPI's GPU support covers "
                       "blocking collectives only"
                     : "blocking")
      << "), " << human_bytes(bytes_ / std::max<int64_t>(1, steps)) << " reduced per step; "
      << "reductions in flight " << human_time(in_flight_s_) << ", waited for "
      << human_time(waited_s_) << ": " << std::fixed << std::setprecision(1)
      << (in_flight_s_ > 0 ? 100.0 * std::max(0.0, 1.0 - waited_s_ / in_flight_s_) : 0.0)
      << std::defaultfloat << "% of the communication hidden behind the backward\n";
}

template class DdpBuckets<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
