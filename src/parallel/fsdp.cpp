#include "kqlora/parallel/fsdp.hpp"

#include <iomanip>
#include <ostream>

#include "kqlora/core/error.hpp"
#include "kqlora/core/human_units.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/optim/optimizer.hpp"

namespace kqlora {

namespace {
// Collectives of the MPI backend read and write host memory; device data goes through
// host mirrors (the NCCL backend will take device pointers directly).
template <class V>
auto host_of(const V& v) {
  return Kokkos::create_mirror_view(Kokkos::HostSpace(), v);
}
}  // namespace

template <class ExecSpace>
Fsdp<ExecSpace>::Fsdp(const ExecSpace& exec, Communicator& comm, Model<ExecSpace>& model)
    : exec_(exec), comm_(comm), model_(model) {
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
void Fsdp<ExecSpace>::gather_nf4(int i) {
  const Nf4Shard<Mem>& mine = shards_[i];
  const int n = comm_.size();
  // Each component's shards, equal-sized, side by side: [rank 0's | rank 1's | ...].
  auto gather = [&](auto local) {
    using T = typename decltype(local)::value_type;
    auto src = host_of(local);
    Kokkos::deep_copy(src, local);
    Kokkos::View<T*, Kokkos::HostSpace> all("kqlora::Fsdp::gathered", local.extent(0) * n);
    comm_.wait(comm_.allgather(src.data(), all.data(), sizeof(T) * local.extent(0)));
    return all;
  };
  auto data = gather(mine.quantized_data);
  auto scalers = gather(mine.quantized_scalers);
  auto factors = gather(mine.quantization_factor);
  std::vector<Nf4Shard<Kokkos::HostSpace>> parts(n);
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
  auto whole = nf4_gather(Kokkos::DefaultHostExecutionSpace(), parts);
  if constexpr (std::is_same<Mem, Kokkos::HostSpace>::value) {
    model_.nf4[i] = whole;
  } else {
    model_.nf4[i] = nf4_copy_to<Mem>(whole);
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
  auto host = host_of(padded_params_);
  Kokkos::deep_copy(host, padded_params_);
  comm_.wait(comm_.allgather(host.data() + shard_offset(), host.data(), 4 * chunk_));
  Kokkos::deep_copy(padded_params_, host);
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
  auto send = host_of(padded_grads_);
  Kokkos::deep_copy(send, padded_grads_);
  auto recv = host_of(shard_grads_);
  comm_.wait(comm_.reduce_scatter_sum(send.data(), recv.data(), chunk_));
  Kokkos::deep_copy(shard_grads_, recv);
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
