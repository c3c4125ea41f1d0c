#include "kqlora/parallel/broadcast_model.hpp"

#include <cstring>

namespace kqlora {

template <class ExecSpace>
void broadcast_model(Communicator& comm, Model<ExecSpace>& model) {
  // One buffer: every NF4 tensor's components, the frozen dense tensors, then the flat
  // float parameters.
  std::vector<std::pair<char*, int64_t>> parts;
  std::vector<Nf4Tensor<Kokkos::HostSpace>> host_nf4;
  for (auto& t : model.nf4) host_nf4.push_back(nf4_copy_to<Kokkos::HostSpace>(t));
  std::vector<Kokkos::View<float*, Kokkos::HostSpace>> host_dense;
  for (auto& t : model.dense)
    host_dense.push_back(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), t));
  auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.params);
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
  comm.wait(comm.broadcast(buf.data(), total, 0));
  off = 0;
  for (const auto& p : parts) {
    std::memcpy(p.first, buf.data() + off, static_cast<size_t>(p.second));
    off += p.second;
  }
  for (size_t i = 0; i < host_nf4.size(); ++i) {
    auto& t = model.nf4[i];
    Kokkos::deep_copy(t.quantized_data, host_nf4[i].quantized_data);
    Kokkos::deep_copy(t.quantized_scalers, host_nf4[i].quantized_scalers);
    Kokkos::deep_copy(t.quantization_factor, host_nf4[i].quantization_factor);
    t.scaler_mean = host_nf4[i].scaler_mean;
  }
  for (size_t i = 0; i < host_dense.size(); ++i) Kokkos::deep_copy(model.dense[i], host_dense[i]);
  Kokkos::deep_copy(model.params, params);
  model.params_changed();
}

template void broadcast_model(Communicator&, Model<Kokkos::DefaultExecutionSpace>&);

}  // namespace kqlora
