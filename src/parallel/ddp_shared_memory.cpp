#include "kqlora/parallel/ddp_shared_memory.hpp"

#include <chrono>
#include <cmath>
#include <exception>
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
std::unique_ptr<DdpSharedMemory<ExecSpace>> DdpSharedMemory<ExecSpace>::create(
    Communicator& comm, Model<ExecSpace>& model, const OptimizerConfig& opt, bool fill) {
  if constexpr (!std::is_same<Mem, Kokkos::HostSpace>::value) {
    (void)comm, (void)model, (void)opt, (void)fill;
    return nullptr;  // device memory: buckets
  } else {
    std::unique_ptr<DdpSharedMemory> d(new DdpSharedMemory(comm, model));
    const int n = comm.size(), r = comm.rank();
    const int64_t P = model.num_params();
    // Chunks of whole 64-byte lines: no two ranks write to one cache line.
    d->chunk_ = ((P + n - 1) / n + 15) / 16 * 16;
    d->padded_ = (P + 15) / 16 * 16;
    auto first = [&](int k) { return std::min(P, k * d->chunk_); };
    auto grads = comm.allocate_shared(4 * d->padded_);
    if (!grads) return nullptr;  // (the same answer on every rank)
    auto params = comm.allocate_shared(4 * (first(r + 1) - first(r)));
    d->state_names_ = Optimizer<ExecSpace>::state_names(opt);
    std::vector<std::unique_ptr<SharedMemory>> state;
    for (size_t k = 0; k < d->state_names_.size(); ++k)
      state.push_back(comm.allocate_shared(4 * (first(r + 1) - first(r))));
    // The views below need the segments end to end (MPI's default for shared windows).
    bool contiguous = true;
    for (int k = 0; k < n; ++k) {
      contiguous &= grads->segment(k) == grads->segment(0) + 4 * d->padded_ * k;
      if (first(k + 1) == first(k)) continue;  // an empty chunk has no address to check
      contiguous &= params->segment(k) == params->segment(0) + 4 * first(k);
      for (auto& s : state) contiguous &= s->segment(k) == s->segment(0) + 4 * first(k);
    }
    if (!contiguous) return nullptr;
    d->grads_ = std::move(grads);
    d->params_ = std::move(params);
    d->state_ = std::move(state);
    // This rank fills its own chunk (all ranks hold rank 0's values after the broadcast);
    // the state starts at zero, as a fresh optimizer's.
    const int64_t lo = d->chunk_offset(), m = d->chunk_size();
    Vec p(reinterpret_cast<float*>(d->params_->segment(0)), P);
    Vec g(reinterpret_cast<float*>(d->grads_->segment(r)), P);
    if (fill) {
      using Kokkos::make_pair;
      const ExecSpace& exec = model.exec();
      Kokkos::deep_copy(exec, Kokkos::subview(p, make_pair(lo, lo + m)),
                        Kokkos::subview(model.params, make_pair(lo, lo + m)));
      Kokkos::deep_copy(exec, g, 0.0f);
      for (const auto& s : d->state_)
        Kokkos::deep_copy(exec, Vec(reinterpret_cast<float*>(s->segment(0)) + lo, m), 0.0f);
      fence(exec, "kqlora::DdpSharedMemory::create");  // (the barrier orders memory, not kernels)
      d->grads_->sync();
    }
    model.use_buffers(p, g);
    return d;
  }
}

template <class ExecSpace>
DdpSharedMemory<ExecSpace>::~DdpSharedMemory() {
  if (!copy_back_ || std::uncaught_exceptions() > 0) return;  // (the windows see to themselves)
  // The model gets private copies back before the shared memory goes.
  Vec p("kqlora::Model::params", model_.num_params());
  Vec g("kqlora::Model::grads", model_.num_params());
  Kokkos::deep_copy(model_.exec(), p, model_.params);
  Kokkos::deep_copy(model_.exec(), g, model_.grads);
  fence(model_.exec(), "kqlora::DdpSharedMemory::copy_back");  // (before the windows go)
  model_.use_buffers(p, g);
}

template <class ExecSpace>
int64_t DdpSharedMemory<ExecSpace>::chunk_offset() const {
  return std::min(model_.num_params(), comm_.rank() * chunk_);
}

template <class ExecSpace>
int64_t DdpSharedMemory<ExecSpace>::chunk_size() const {
  return std::min(model_.num_params(), chunk_offset() + chunk_) - chunk_offset();
}

template <class ExecSpace>
typename DdpSharedMemory<ExecSpace>::Vec DdpSharedMemory<ExecSpace>::chunk_params() const {
  return Kokkos::subview(model_.params,
                         Kokkos::make_pair(chunk_offset(), chunk_offset() + chunk_size()));
}

template <class ExecSpace>
typename DdpSharedMemory<ExecSpace>::Vec DdpSharedMemory<ExecSpace>::chunk_grads() const {
  return Kokkos::subview(model_.grads,
                         Kokkos::make_pair(chunk_offset(), chunk_offset() + chunk_size()));
}

template <class ExecSpace>
Optimizer<ExecSpace> DdpSharedMemory<ExecSpace>::make_optimizer(const ExecSpace& exec,
                                                                const OptimizerConfig& cfg) const {
  std::vector<Vec> buffers;
  for (const auto& s : state_)
    buffers.emplace_back(reinterpret_cast<float*>(s->segment(0)) + chunk_offset(), chunk_size());
  return Optimizer<ExecSpace>(exec, cfg, buffers);
}

template <class ExecSpace>
typename DdpSharedMemory<ExecSpace>::NamedVecs DdpSharedMemory<ExecSpace>::optimizer_state(
    const Optimizer<ExecSpace>&) const {
  NamedVecs v;
  for (size_t k = 0; k < state_.size(); ++k)
    v.emplace_back(state_names_[k],
                   Vec(reinterpret_cast<float*>(state_[k]->segment(0)), model_.num_params()));
  return v;
}

template <class ExecSpace>
void DdpSharedMemory<ExecSpace>::reduce_gradients() {
  if constexpr (std::is_same<Mem, Kokkos::HostSpace>::value) {
    const auto t0 = Clock::now();
    fence(ExecSpace(),
          "kqlora::DdpSharedMemory::reduce_gradients");  // this rank's gradients are in memory
    grads_->sync();                                      // every rank's backward is done
    const auto t1 = Clock::now();
    // Rank k's gradients are row k; this rank's chunk of the sum, in rank order (the same
    // order on every rank and every run), into its own row, with the sum of squares for
    // grad_norm() in the same pass, in blocks of 64 that stay in vector registers.
    constexpr int64_t B = 64;
    const int n = comm_.size(), me = comm_.rank();
    const int64_t stride = padded_, lo = chunk_offset(), hi = lo + chunk_size();
    float* const rows = reinterpret_cast<float*>(grads_->segment(0));
    double ss = 0;
    Kokkos::parallel_reduce(
        "kqlora::DdpSharedMemory::sum_chunk",
        Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<int64_t>>(
            0, (hi - lo + B - 1) / B),
        [=](int64_t b, double& acc) {
          const int64_t i0 = lo + b * B, m = std::min(B, hi - i0);
          float s[B] = {};
          for (int64_t j = 0; j < m; ++j) s[j] = rows[i0 + j];
          for (int k = 1; k < n; ++k) {
            const float* r = rows + k * stride + i0;
            for (int64_t j = 0; j < m; ++j) s[j] += r[j];
          }
          float* out = rows + me * stride + i0;
          for (int64_t j = 0; j < m; ++j) out[j] = s[j];
          acc += sum_of_squares_64(s);  // (zeros past m add nothing)
        },
        ss);
    chunk_sum_squares_ = ss;
    waited_s_ += std::chrono::duration<double>(t1 - t0).count();
    sum_s_ += seconds_since(t1);
    bytes_ += 4.0 * model_.num_params();
  }
}

template <class ExecSpace>
double DdpSharedMemory<ExecSpace>::grad_norm(const ExecSpace&) {
  double ss = chunk_sum_squares_;  // (summed with the gradients in reduce_gradients())
  comm_.wait(comm_.allreduce_sum(&ss, 1));
  return std::sqrt(ss);
}

template <class ExecSpace>
void DdpSharedMemory<ExecSpace>::after_update(bool updated) {
  fence(ExecSpace(), "kqlora::DdpSharedMemory::after_update");  // this rank's update is in memory
  grads_->sync();
  if (updated) model_.params_changed();
}

template <class ExecSpace>
void DdpSharedMemory<ExecSpace>::report(std::ostream& log, int64_t steps) const {
  log << "DDP: gradients, weights and optimizer state in node shared memory; each rank "
         "sums and updates 1/"
      << comm_.size() << " of " << human_bytes(bytes_ / std::max<int64_t>(1, steps))
      << " per step; waited for the other ranks " << human_time(waited_s_) << ", summing "
      << human_time(sum_s_) << "\n";
}

template class DdpSharedMemory<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
