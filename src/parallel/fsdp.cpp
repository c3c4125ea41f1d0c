#include "kqlora/parallel/fsdp.hpp"

#include <iomanip>
#include <ostream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/optim/optimizer.hpp"

namespace kqlora {

namespace {

/// A view of `n` elements at the front of `buf`, which grows (never shrinks) to hold them:
/// the gathers reuse one buffer from weight to weight instead of allocating per use.
template <class T, class M>
Kokkos::View<T*, M> front_of(Kokkos::View<T*, M>& buf, int64_t n, const char* label) {
  if (static_cast<int64_t>(buf.extent(0)) < n) {
    buf = Kokkos::View<T*, M>();  // (the old one gone before the new one exists)
    buf =
        Kokkos::View<T*, M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
  }
  return Kokkos::subview(buf, Kokkos::make_pair(int64_t(0), n));
}

}  // namespace

template <class ExecSpace>
Fsdp<ExecSpace>::Fsdp(const ExecSpace& exec, Communicator& comm, Model<ExecSpace>& model)
    : exec_(exec),
      comm_(comm),
      model_(model),
      direct_(std::is_same<Mem, Kokkos::HostSpace>::value || comm.nonblocking_device_buffers()) {
  const int n = comm.size(), r = comm.rank();
  for (auto& w : model.nf4) {
    shards_.push_back(nf4_shard(exec, w, r, n));
    w = Nf4Tensor<Mem>();  // the whole weight exists only around its uses from now on
  }
  const int64_t P = model.num_params();
  chunk_ = (P + n - 1) / n;
  padded_params_ = Vec("kqlora::Fsdp::params", chunk_ * n);
  padded_grads_ = Vec("kqlora::Fsdp::grads", chunk_ * n);
  shard_grads_ = Vec("kqlora::Fsdp::shard_grads", chunk_);
  using Kokkos::make_pair;
  Kokkos::deep_copy(exec, Kokkos::subview(padded_params_, make_pair(int64_t(0), P)), model.params);
  model.set_base_hooks(
      [this](int g) {
        for (int i : model_.table().nf4_of_group(g)) gather_nf4(i);
      },
      [this](int g) {
        for (int i : model_.table().nf4_of_group(g)) model_.nf4[i] = Nf4Tensor<Mem>();
      });
}

template <class ExecSpace>
Fsdp<ExecSpace>::~Fsdp() {
  model_.set_base_hooks({}, {});
}

template <class ExecSpace>
typename Fsdp<ExecSpace>::Vec Fsdp<ExecSpace>::shard_params() const {
  return Kokkos::subview(padded_params_,
                         Kokkos::make_pair(shard_offset(), shard_offset() + chunk_));
}

template <class ExecSpace>
int64_t Fsdp<ExecSpace>::base_shard_bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_)
    b += s.quantized_data.extent(0) + s.quantized_scalers.extent(0) +
         4 * s.quantization_factor.extent(0) + 4;
  return b;
}

template <class ExecSpace>
template <class GExec, class M>
Nf4Tensor<M> Fsdp<ExecSpace>::gather_shards(const GExec& gexec, const Nf4Shard<Mem>& mine,
                                            Gathered<M>& buf) {
  const int n = comm_.size();
  // Each component's shards, equal-sized, side by side: [rank 0's | rank 1's | ...], in
  // `buf` (M: the model's memory when the communicator takes it, else host memory).
  // The shard where the collective reads it (itself when M is Mem; else a host copy, made
  // on the model's instance: no device-wide sync).
  auto stage = [&](auto local) {
    auto src = Kokkos::create_mirror_view(M(), local);
    Kokkos::deep_copy(exec_, src, local);
    return src;
  };
  auto data_src = stage(mine.quantized_data);
  auto scalers_src = stage(mine.quantized_scalers);
  auto factors_src = stage(mine.quantization_factor);
  fence(exec_, "kqlora::Fsdp::gather_nf4");  // (the shard is complete before a collective reads it)
  auto gather = [&](auto src, auto& into, const char* label) {
    using T = typename decltype(src)::value_type;
    auto all = front_of(into, static_cast<int64_t>(src.extent(0)) * n, label);
    comm_.wait(comm_.allgather(src.data(), all.data(), sizeof(T) * src.extent(0)));
    return all;
  };
  auto data = gather(data_src, buf.data, "kqlora::Fsdp::gathered_data");
  auto scalers = gather(scalers_src, buf.scalers, "kqlora::Fsdp::gathered_scalers");
  auto factors = gather(factors_src, buf.factors, "kqlora::Fsdp::gathered_factors");
  std::vector<Nf4Shard<M>> parts(n);
  using Kokkos::make_pair;
  for (int r = 0; r < n; ++r) {
    auto& p = parts[r];
    p.global = mine.global;
    p.shard_index = r;
    p.num_shards = n;
    p.range = nf4_shard_range(mine.global, r, n);
    const int64_t nd = mine.quantized_data.extent(0), ns = mine.quantized_scalers.extent(0),
                  nf = mine.quantization_factor.extent(0);
    p.quantized_data = Kokkos::subview(data, make_pair(r * nd, (r + 1) * nd));
    p.quantized_scalers = Kokkos::subview(scalers, make_pair(r * ns, (r + 1) * ns));
    p.quantization_factor = Kokkos::subview(factors, make_pair(r * nf, (r + 1) * nf));
    p.scaler_mean = mine.scaler_mean;
  }
  return nf4_gather(gexec, parts);
}

template <class ExecSpace>
void Fsdp<ExecSpace>::gather_nf4(int i) {
  if (direct_) {
    // On the model's memory: NCCL gathers into a device buffer, the weight is reassembled
    // by device copies (no host round trip, nothing allocated but the weight itself).
    model_.nf4[i] = gather_shards(exec_, shards_[i], gathered_);
  } else {
    // Through host memory (an MPI that cannot take device buffers in non-blocking calls),
    // then to the model's memory on its instance; fenced: the next gather rewrites the
    // host buffers and the host tensor is freed.
    const auto host =
        gather_shards(Kokkos::DefaultHostExecutionSpace(), shards_[i], host_gathered_);
    model_.nf4[i] = nf4_copy_to<Mem>(exec_, host);
    fence(exec_, "kqlora::Fsdp::gather_nf4_to_device");  // (before `host` goes)
  }
}

template <class ExecSpace>
auto Fsdp<ExecSpace>::whole_nf4(int i) -> Nf4Tensor<Mem> {
  gather_nf4(i);
  auto t = model_.nf4[i];
  model_.nf4[i] = Nf4Tensor<Mem>();
  return t;
}

template <class ExecSpace>
void Fsdp<ExecSpace>::gather_params() {
  const int64_t P = model_.num_params();
  fence(exec_, "kqlora::Fsdp::gather_params");  // (the optimizer's update is complete)
  if (direct_) {
    comm_.wait(
        comm_.allgather(padded_params_.data() + shard_offset(), padded_params_.data(), 4 * chunk_));
  } else {
    // (on the model's instance: the fence above covers the update; this one the copy)
    auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), padded_params_);
    Kokkos::deep_copy(exec_, host, padded_params_);
    fence(exec_, "kqlora::Fsdp::gather_params_to_host");
    comm_.wait(comm_.allgather(host.data() + shard_offset(), host.data(), 4 * chunk_));
    Kokkos::deep_copy(exec_, padded_params_, host);
    fence(exec_, "kqlora::Fsdp::gather_params_from_host");  // (host is freed on return)
  }
  Kokkos::deep_copy(exec_, model_.params,
                    Kokkos::subview(padded_params_, Kokkos::make_pair(int64_t(0), P)));
  model_.params_changed();
}

template <class ExecSpace>
void Fsdp<ExecSpace>::reduce_scatter_grads() {
  const int64_t P = model_.num_params();
  using Kokkos::make_pair;
  Kokkos::deep_copy(exec_, padded_grads_, 0.0f);
  Kokkos::deep_copy(exec_, Kokkos::subview(padded_grads_, make_pair(int64_t(0), P)), model_.grads);
  fence(exec_, "kqlora::Fsdp::reduce_scatter_grads");
  if (direct_) {
    comm_.wait(comm_.reduce_scatter_sum(padded_grads_.data(), shard_grads_.data(), chunk_));
    return;
  }
  auto send = Kokkos::create_mirror_view(Kokkos::HostSpace(), padded_grads_);
  Kokkos::deep_copy(exec_, send, padded_grads_);
  fence(exec_, "kqlora::Fsdp::reduce_scatter_to_host");
  auto recv = Kokkos::create_mirror_view(Kokkos::HostSpace(), shard_grads_);
  comm_.wait(comm_.reduce_scatter_sum(send.data(), recv.data(), chunk_));
  Kokkos::deep_copy(exec_, shard_grads_, recv);
  fence(exec_, "kqlora::Fsdp::reduce_scatter_from_host");  // (recv is freed on return)
}

template <class ExecSpace>
double Fsdp<ExecSpace>::global_grad_norm() {
  const double local = kqlora::grad_norm(exec_, shard_grads_);
  double ss = local * local;
  comm_.wait(comm_.allreduce_sum(&ss, 1));
  return std::sqrt(ss);
}

template <class ExecSpace>
void Fsdp<ExecSpace>::describe(std::ostream& log) const {
  int64_t whole = 0;
  for (const auto& s : shards_) {
    const auto& L = s.global;
    whole += L.num_bytes() + L.num_blocks() + 4 * L.num_scaler_blocks() + 4;
  }
  const double mine = static_cast<double>(base_shard_bytes());
  log << "FSDP: base weights on rank 0 " << human_bytes(mine) << " (" << mine << " B, "
      << std::fixed << std::setprecision(3) << mine / (static_cast<double>(whole) / comm_.size())
      << std::defaultfloat << " x total/N; total " << human_bytes(static_cast<double>(whole))
      << "), parameter chunk " << shard_size() << " of " << model_.num_params() << "\n";
}

template class Fsdp<Kokkos::DefaultExecutionSpace>;

}  // namespace kqlora
