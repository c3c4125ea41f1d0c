#include "kqlora/parallel/ddp.hpp"

#include <cmath>
#include <cstring>
#include <exception>

#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"

namespace kqlora {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

template <class ExecSpace>
Ddp<ExecSpace>::Ddp(Communicator& comm, Model<ExecSpace>& model, double bucket_mb, bool overlap)
    : comm_(comm),
      model_(model),
      overlap_(overlap && (std::is_same<Mem, Kokkos::HostSpace>::value || comm.device_buffers())) {
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
        // wait for finish().
        if (--b.pending == 0 && !staged()) start(b);
        progress();
      },
      [this] {
        if (armed_) progress();
      });
}

template <class ExecSpace>
Ddp<ExecSpace>::~Ddp() {
  model_.set_backward_hooks({}, {});
  if (!shared_ || !copy_back_) return;
  if (std::uncaught_exceptions() > 0) return;  // (the windows see to themselves)
  // The model gets private copies back before the shared memory goes.
  using Vec = typename Model<ExecSpace>::Vec;
  Vec p("kqlora::Model::params", model_.num_params());
  Vec g("kqlora::Model::grads", model_.num_params());
  Kokkos::deep_copy(p, model_.params);
  Kokkos::deep_copy(g, model_.grads);
  model_.use_buffers(p, g);
}

template <class ExecSpace>
bool Ddp<ExecSpace>::share_node_memory(const OptimizerConfig& opt, bool fill) {
  if constexpr (!std::is_same<Mem, Kokkos::HostSpace>::value) {
    (void)opt, (void)fill;
    return false;  // device memory: buckets
  } else {
    using Vec = typename Model<ExecSpace>::Vec;
    const int n = comm_.size(), r = comm_.rank();
    const int64_t P = model_.num_params();
    // Chunks of whole 64-byte lines: no two ranks write to one cache line.
    chunk_ = ((P + n - 1) / n + 15) / 16 * 16;
    padded_ = (P + 15) / 16 * 16;
    auto first = [&](int k) { return std::min(P, k * chunk_); };
    auto grads = comm_.allocate_shared(4 * padded_);
    if (!grads) return false;  // (the same answer on every rank)
    auto params = comm_.allocate_shared(4 * (first(r + 1) - first(r)));
    state_names_ = Optimizer<ExecSpace>::state_names(opt);
    std::vector<std::unique_ptr<SharedMemory>> state;
    for (size_t k = 0; k < state_names_.size(); ++k)
      state.push_back(comm_.allocate_shared(4 * (first(r + 1) - first(r))));
    // The views below need the segments end to end (MPI's default for shared windows).
    bool contiguous = true;
    for (int k = 0; k < n; ++k) {
      contiguous &= grads->segment(k) == grads->segment(0) + 4 * padded_ * k;
      if (first(k + 1) == first(k)) continue;  // an empty chunk has no address to check
      contiguous &= params->segment(k) == params->segment(0) + 4 * first(k);
      for (auto& s : state) contiguous &= s->segment(k) == s->segment(0) + 4 * first(k);
    }
    if (!contiguous) return false;
    shared_ = std::move(grads);
    shared_params_ = std::move(params);
    shared_state_ = std::move(state);
    // This rank fills its own chunk (all ranks hold rank 0's values after the broadcast);
    // the state starts at zero, as a fresh optimizer's.
    const int64_t lo = chunk_offset(), m = chunk_size();
    Vec p(reinterpret_cast<float*>(shared_params_->segment(0)), P);
    Vec g(reinterpret_cast<float*>(shared_->segment(r)), P);
    if (fill) {
      using Kokkos::make_pair;
      Kokkos::deep_copy(Kokkos::subview(p, make_pair(lo, lo + m)),
                        Kokkos::subview(model_.params, make_pair(lo, lo + m)));
      Kokkos::deep_copy(g, 0.0f);
      for (const auto& buf : optimizer_buffers()) Kokkos::deep_copy(buf, 0.0f);
      fence_all("kqlora::Ddp::share_node_memory");  // (the barrier orders memory, not kernels)
      shared_->sync();
    }
    model_.use_buffers(p, g);
    model_.set_backward_hooks({}, {});  // no buckets
    return true;
  }
}

template <class ExecSpace>
int64_t Ddp<ExecSpace>::chunk_offset() const {
  return shared_ ? std::min(model_.num_params(), comm_.rank() * chunk_) : 0;
}

template <class ExecSpace>
int64_t Ddp<ExecSpace>::chunk_size() const {
  if (!shared_) return model_.num_params();
  return std::min(model_.num_params(), chunk_offset() + chunk_) - chunk_offset();
}

template <class ExecSpace>
std::vector<typename Model<ExecSpace>::Vec> Ddp<ExecSpace>::optimizer_buffers() const {
  std::vector<typename Model<ExecSpace>::Vec> v;
  for (const auto& s : shared_state_)
    v.emplace_back(reinterpret_cast<float*>(s->segment(0)) + chunk_offset(), chunk_size());
  return v;
}

template <class ExecSpace>
std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>> Ddp<ExecSpace>::optimizer_state(
    const Optimizer<ExecSpace>& opt) const {
  if (!shared_) return opt.state();
  std::vector<std::pair<std::string, typename Model<ExecSpace>::Vec>> v;
  for (size_t k = 0; k < shared_state_.size(); ++k)
    v.emplace_back(state_names_[k], typename Model<ExecSpace>::Vec(
                                        reinterpret_cast<float*>(shared_state_[k]->segment(0)),
                                        model_.num_params()));
  return v;
}

template <class ExecSpace>
double Ddp<ExecSpace>::grad_norm(const ExecSpace& exec) {
  if (!shared_) return kqlora::grad_norm(exec, model_.grads);
  double ss = chunk_sum_squares_;  // (summed with the gradients in finish())
  comm_.wait(comm_.allreduce_sum(&ss, 1));
  return std::sqrt(ss);
}

template <class ExecSpace>
void Ddp<ExecSpace>::updated() {
  if (!shared_) return;
  fence_all("kqlora::Ddp::updated");  // this rank's optimizer update is in memory
  shared_->sync();
}

template <class ExecSpace>
bool Ddp<ExecSpace>::staged() const {
  return !std::is_same<Mem, Kokkos::HostSpace>::value && !comm_.device_buffers();
}

template <class ExecSpace>
float* Ddp<ExecSpace>::grads_buffer() {
  // Device gradients with a host-memory backend (MPI) go through the host once, after the
  // backward (finish copies them in and out); otherwise they are reduced where they are.
  return staged() ? staging_.data() : model_.grads.data();
}

template <class ExecSpace>
void Ddp<ExecSpace>::broadcast_parameters() {
  // One buffer: every NF4 tensor's components, the frozen dense tensors, then the flat
  // float parameters.
  std::vector<std::pair<char*, int64_t>> parts;
  std::vector<Nf4Tensor<Kokkos::HostSpace>> host_nf4;
  for (auto& t : model_.nf4) host_nf4.push_back(nf4_copy_to<Kokkos::HostSpace>(t));
  std::vector<Kokkos::View<float*, Kokkos::HostSpace>> host_dense;
  for (auto& t : model_.dense)
    host_dense.push_back(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t));
  auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model_.params);
  for (auto& t : host_nf4) {
    parts.push_back(
        {reinterpret_cast<char*>(t.quantized_data.data()), int64_t(t.quantized_data.extent(0))});
    parts.push_back({reinterpret_cast<char*>(t.quantized_scalers.data()),
                     int64_t(t.quantized_scalers.extent(0))});
    parts.push_back({reinterpret_cast<char*>(t.quantization_factor.data()),
                     4 * int64_t(t.quantization_factor.extent(0))});
    parts.push_back({reinterpret_cast<char*>(&t.scaler_mean), 4});
  }
  for (auto& t : host_dense)
    parts.push_back({reinterpret_cast<char*>(t.data()), 4 * int64_t(t.extent(0))});
  parts.push_back({reinterpret_cast<char*>(params.data()), 4 * int64_t(params.extent(0))});
  int64_t total = 0;
  for (const auto& p : parts) total += p.second;
  std::vector<char> buf(static_cast<size_t>(total));
  int64_t off = 0;
  for (const auto& p : parts) {
    std::memcpy(buf.data() + off, p.first, static_cast<size_t>(p.second));
    off += p.second;
  }
  comm_.wait(comm_.broadcast(buf.data(), total, 0));
  off = 0;
  for (const auto& p : parts) {
    std::memcpy(p.first, buf.data() + off, static_cast<size_t>(p.second));
    off += p.second;
  }
  for (size_t i = 0; i < host_nf4.size(); ++i) {
    auto& t = model_.nf4[i];
    Kokkos::deep_copy(t.quantized_data, host_nf4[i].quantized_data);
    Kokkos::deep_copy(t.quantized_scalers, host_nf4[i].quantized_scalers);
    Kokkos::deep_copy(t.quantization_factor, host_nf4[i].quantization_factor);
    t.scaler_mean = host_nf4[i].scaler_mean;
  }
  for (size_t i = 0; i < host_dense.size(); ++i) Kokkos::deep_copy(model_.dense[i], host_dense[i]);
  Kokkos::deep_copy(model_.params, params);
  model_.params_changed();
}

template <class ExecSpace>
void Ddp<ExecSpace>::arm() {
  armed_ = true;
  for (auto& b : buckets_) {
    b.pending = b.groups;
    b.request.reset();
    b.finished = false;
  }
}

template <class ExecSpace>
void Ddp<ExecSpace>::start(Bucket& b) {
  float* g = grads_buffer();
  b.started = Clock::now();
  stats_.bytes += 4.0 * (b.hi - b.lo);
  ++stats_.buckets;
  if (overlap_) {
    b.request = comm_.allreduce_sum(g + b.lo, b.hi - b.lo);
    return;
  }
  // Blocking, as soon as the bucket is ready: all of its time is exposed.
  comm_.allreduce_sum_blocking(g + b.lo, b.hi - b.lo);
  const double t = since(b.started);
  stats_.in_flight_s += t;
  stats_.waited_s += t;
  b.finished = true;
  b.request = std::make_unique<Request>();
  b.request->done = true;
}

template <class ExecSpace>
void Ddp<ExecSpace>::progress() {
  for (auto& b : buckets_) {
    if (b.request && !b.finished && comm_.test(*b.request)) {
      b.finished = true;
      stats_.in_flight_s += since(b.started);
    }
  }
}

template <class ExecSpace>
void Ddp<ExecSpace>::finish() {
  KQLORA_CHECK(armed_, "Ddp::finish without arm");
  armed_ = false;
  const auto t0 = Clock::now();
  if (shared_) {
    if constexpr (std::is_same<Mem, Kokkos::HostSpace>::value) {
      fence_all("kqlora::Ddp::finish");  // this rank's gradients are in memory
      shared_->sync();                   // every rank's backward is done
      const auto t1 = Clock::now();
      // Rank k's gradients are row k; this rank's chunk of the sum, in rank order (the
      // same order on every rank and every run), into its own row, with the sum of squares
      // for grad_norm() in the same pass, in blocks of 64 that stay in vector registers.
      constexpr int64_t B = 64;
      const int n = comm_.size(), me = comm_.rank();
      const int64_t stride = padded_, lo = chunk_offset(), hi = lo + chunk_size();
      float* const rows = reinterpret_cast<float*>(shared_->segment(0));
      double ss = 0;
      Kokkos::parallel_reduce(
          "kqlora::Ddp::sum_chunk",
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
      stats_.waited_s += std::chrono::duration<double>(t1 - t0).count();
      stats_.sum_s += since(t1);
      stats_.in_flight_s += since(t0);
      stats_.bytes += 4.0 * model_.num_params();
      ++stats_.buckets;
    }
    return;
  }
  if (staged()) {
    if (staging_.extent(0) != model_.grads.extent(0))
      staging_ =
          Kokkos::View<float*, Kokkos::HostSpace>("kqlora::Ddp::staging", model_.grads.extent(0));
    Kokkos::deep_copy(staging_, model_.grads);
  }
  for (auto& b : buckets_)
    if (!b.request) start(b);  // no overlap, or a group without a hook call
  for (auto& b : buckets_) {
    if (b.finished) continue;
    comm_.wait(*b.request);
    b.finished = true;
    stats_.in_flight_s += since(b.started);
  }
  stats_.waited_s += since(t0);
  if (staged()) Kokkos::deep_copy(model_.grads, staging_);
}

template class Ddp<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
