#include "kqlora/parallel/broadcast_model.hpp"

#include <algorithm>

namespace kqlora {

namespace {

/// Broadcasts `bytes` at `data` from rank 0, in slices of at most 64 MiB.
void broadcast_bytes(Communicator& comm, void* data, int64_t bytes) {
  constexpr int64_t kSlice = int64_t(64) << 20;
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes; off += kSlice)
    comm.wait(comm.broadcast(p + off, std::min(kSlice, bytes - off), 0));
}

/// Broadcasts a view's elements in place: host views, and device views where the
/// communicator takes device buffers (NCCL), directly; others through a host copy of that
/// one view.
template <class View>
void broadcast_view(Communicator& comm, const View& v) {
  const int64_t bytes =
      static_cast<int64_t>(sizeof(typename View::value_type)) * static_cast<int64_t>(v.size());
  if (comm.nonblocking_device_buffers()) {
    broadcast_bytes(comm, v.data(), bytes);
    return;
  }
  // device-wide: DDP set-up
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  broadcast_bytes(comm, h.data(), bytes);
  Kokkos::deep_copy(v, h);  // device-wide: DDP set-up (a no-op when h is v)
}

}  // namespace

template <class ExecSpace>
void broadcast_model(Communicator& comm, Model<ExecSpace>& model) {
  // Tensor by tensor, in place: no second copy of the model on any rank (one packed buffer
  // of the whole base was 1.4 GiB of set-up RSS at the Llama-3.2-1B shape).
  for (auto& t : model.nf4) {
    broadcast_view(comm, t.quantized_data);
    broadcast_view(comm, t.quantized_scalers);
    broadcast_view(comm, t.quantization_factor);
    broadcast_bytes(comm, &t.scaler_mean, sizeof(t.scaler_mean));
  }
  for (auto& t : model.dense) broadcast_view(comm, t);
  for (auto& t : model.dense_bf16) broadcast_view(comm, t);
  broadcast_view(comm, model.params);
  model.params_changed();
}

template void broadcast_model(Communicator&, Model<Kokkos::DefaultExecutionSpace>&);

}  // namespace kqlora
