#include "kqlora/dist/ddp.hpp"

#include <cstring>

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
Ddp<ExecSpace>::Ddp(dist::Communicator& comm, LoraModel<ExecSpace>& model, double bucket_mb,
                    bool overlap)
    : comm_(comm), model_(model), overlap_(overlap && std::is_same<Mem, Kokkos::HostSpace>::value) {
  const auto& info = model.params_info();
  const int L = static_cast<int>(model.config().num_layers);
  // Layer l's parameters are one contiguous range; buckets gather layers from the last
  // (whose gradients are ready first) down, each at least bucket_mb.
  std::vector<int64_t> lo(L, INT64_MAX), hi(L, 0);
  for (const auto& p : info) {
    const int l = std::stoi(p.name.substr(7, p.name.find('.', 7) - 7));
    lo[l] = std::min(lo[l], p.offset);
    hi[l] = std::max(hi[l], p.offset + p.numel);
  }
  const int64_t target = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20) / 4));
  bucket_of_layer_.assign(L, -1);
  for (int l = L - 1; l >= 0; --l) {
    if (buckets_.empty() || buckets_.back().hi - buckets_.back().lo >= target) {
      buckets_.emplace_back();
      buckets_.back().hi = hi[l];
      buckets_.back().last_layer = l;
    }
    Bucket& b = buckets_.back();
    b.lo = lo[l];
    b.first_layer = l;
    bucket_of_layer_[l] = static_cast<int>(buckets_.size()) - 1;
  }
  model_.set_backward_hooks(
      [this](int layer) {
        if (!armed_) return;
        Bucket& b = buckets_[bucket_of_layer_[layer]];
        // Host gradients can go as soon as the bucket is complete; device ones (through the
        // host with MPI) wait for finish().
        if (--b.pending == 0 && std::is_same<Mem, Kokkos::HostSpace>::value) start(b);
        progress();
      },
      [this] {
        if (armed_) progress();
      });
}

template <class ExecSpace>
Ddp<ExecSpace>::~Ddp() {
  model_.set_backward_hooks({}, {});
}

template <class ExecSpace>
float* Ddp<ExecSpace>::grads_host() {
  if constexpr (std::is_same<Mem, Kokkos::HostSpace>::value) {
    return model_.grads.data();
  } else {
    // Device gradients with the MPI backend go through the host once, after the backward
    // (finish copies them in and out); the NCCL backend will reduce device memory directly.
    return staging_.data();
  }
}

template <class ExecSpace>
void Ddp<ExecSpace>::broadcast_parameters() {
  // One buffer: every layer's NF4 components, then the flat float parameters.
  std::vector<std::pair<char*, int64_t>> parts;
  std::vector<Nf4Tensor<Kokkos::HostSpace>> host_base;
  for (auto& t : model_.base) host_base.push_back(nf4_copy_to<Kokkos::HostSpace>(t));
  auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model_.params);
  for (auto& t : host_base) {
    parts.push_back(
        {reinterpret_cast<char*>(t.quantized_data.data()), int64_t(t.quantized_data.extent(0))});
    parts.push_back({reinterpret_cast<char*>(t.quantized_scalers.data()),
                     int64_t(t.quantized_scalers.extent(0))});
    parts.push_back({reinterpret_cast<char*>(t.quantization_factor.data()),
                     4 * int64_t(t.quantization_factor.extent(0))});
    parts.push_back({reinterpret_cast<char*>(&t.scaler_mean), 4});
  }
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
  for (size_t l = 0; l < host_base.size(); ++l) {
    auto& t = model_.base[l];
    Kokkos::deep_copy(t.quantized_data, host_base[l].quantized_data);
    Kokkos::deep_copy(t.quantized_scalers, host_base[l].quantized_scalers);
    Kokkos::deep_copy(t.quantization_factor, host_base[l].quantization_factor);
    t.scaler_mean = host_base[l].scaler_mean;
  }
  Kokkos::deep_copy(model_.params, params);
  model_.params_changed();
}

template <class ExecSpace>
void Ddp<ExecSpace>::arm() {
  armed_ = true;
  for (auto& b : buckets_) {
    b.pending = b.last_layer - b.first_layer + 1;
    b.request.reset();
    b.finished = false;
  }
}

template <class ExecSpace>
void Ddp<ExecSpace>::start(Bucket& b) {
  float* g = grads_host();
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
  b.request = std::make_unique<dist::Request>();
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
  KQLORA_THROW_IF(!armed_, "Ddp::finish without arm");
  armed_ = false;
  const auto t0 = Clock::now();
  if constexpr (!std::is_same<Mem, Kokkos::HostSpace>::value) {
    if (staging_.extent(0) != model_.grads.extent(0))
      staging_ =
          Kokkos::View<float*, Kokkos::HostSpace>("kqlora::Ddp::staging", model_.grads.extent(0));
    Kokkos::deep_copy(staging_, model_.grads);
  }
  for (auto& b : buckets_)
    if (!b.request) start(b);  // no overlap, or a layer without a hook call
  for (auto& b : buckets_) {
    if (b.finished) continue;
    comm_.wait(*b.request);
    b.finished = true;
    stats_.in_flight_s += since(b.started);
  }
  stats_.waited_s += since(t0);
  if constexpr (!std::is_same<Mem, Kokkos::HostSpace>::value)
    Kokkos::deep_copy(model_.grads, staging_);
}

template class Ddp<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
