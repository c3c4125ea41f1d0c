// The NCCL backend of Communicator (built with KQLORA_ENABLE_NCCL): collectives on
// device memory, on a communication stream that waits for the compute stream Kokkos uses
// (an event recorded there), so they overlap the compute that follows. Bootstrapped from
// MPI the nccl-tests way: rank 0 calls ncclGetUniqueId, MPI_Bcast of the id,
// ncclCommInitRank on the GPU Kokkos selected; a build without MPI is a world of one (its
// own id, no broadcast). NCCL counts are elements. Buffers in host memory (the trainer's
// loss and norm scalars, host-staged data) go through a device scratch buffer: every call
// site works with either kind of memory. Every CUDA and
// NCCL call is checked; a wait past the deadline aborts the communicator (ncclCommAbort)
// and throws.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kqlora/build_config.hpp"
#include "kqlora/core/error.hpp"
#if KQLORA_HAVE_MPI
#include "kqlora/core/mpi_check.hpp"
#endif
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/parallel/nccl_communicator.hpp"

#define KQLORA_CHECK_CUDA(call)                                                \
  do {                                                                         \
    const cudaError_t kqlora_cuda_rc_ = (call);                                \
    KQLORA_CHECK(kqlora_cuda_rc_ == cudaSuccess,                               \
                 #call << " failed: " << cudaGetErrorString(kqlora_cuda_rc_)); \
  } while (0)

#define KQLORA_CHECK_NCCL(call)                                                \
  do {                                                                         \
    const ncclResult_t kqlora_nccl_rc_ = (call);                               \
    KQLORA_CHECK(kqlora_nccl_rc_ == ncclSuccess,                               \
                 #call << " failed: " << ncclGetErrorString(kqlora_nccl_rc_)); \
  } while (0)

namespace kqlora {

namespace {

bool on_device(const void* p) {
  cudaPointerAttributes a;
  KQLORA_CHECK_CUDA(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/// Page-locked host buffers, reused: allocating or freeing one synchronises the device, so
/// it happens only when the pool grows (before a collective is queued) and at the end.
class PinnedPool {
 public:
  ~PinnedPool() {
    for (auto& b : blocks_)
      if (!b.busy) cudaFreeHost(b.p);  // (a busy one may still be a copy's target: leaked)
  }
  void* acquire(size_t bytes) {
    for (auto& b : blocks_)
      if (!b.busy && b.bytes >= bytes) {
        b.busy = true;
        return b.p;
      }
    void* p = nullptr;
    KQLORA_CHECK_CUDA(cudaMallocHost(&p, bytes));
    blocks_.push_back({p, bytes, true});
    return p;
  }
  void release(void* p) {
    for (auto& b : blocks_)
      if (b.p == p) b.busy = false;
  }

 private:
  struct Block {
    void* p;
    size_t bytes;
    bool busy;
  };
  std::vector<Block> blocks_;
};

class NcclRequest : public Request {
 public:
  cudaEvent_t done_event = nullptr;
  // A host receive buffer: the result lands in pinned memory (a truly asynchronous copy, so
  // no call blocks past the deadline) and is copied out once the request completes.
  PinnedPool* pool = nullptr;
  void* pinned = nullptr;
  void* host_dst = nullptr;
  size_t host_bytes = 0;
  ~NcclRequest() override {
    // A pinned buffer goes back to the pool only once its copy is done; otherwise it stays
    // taken (a timed-out collective may still write it).
    if (pinned && done_event && cudaEventQuery(done_event) == cudaSuccess) pool->release(pinned);
    if (done_event) cudaEventDestroy(done_event);  // no throw from a destructor
  }
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int device, cudaStream_t compute, double timeout_s)
      : device_(device), compute_(compute) {
    timeout_s_ = timeout_s;
    ncclUniqueId id;
#if KQLORA_HAVE_MPI
    KQLORA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    KQLORA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
#else
    rank_ = 0;  // (size_ is 1)
#endif
    // The id's broadcast and ncclCommInitRank wait for every rank: a rank that never gets
    // here ends the job after comm_timeout_s instead of hanging it.
    Watchdog::Guard guard(*this, "start-up (the NCCL id's broadcast and ncclCommInitRank)");
#if KQLORA_HAVE_MPI
    if (rank_ == 0) KQLORA_CHECK_NCCL(ncclGetUniqueId(&id));
    KQLORA_CHECK_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
#else
    KQLORA_CHECK_NCCL(ncclGetUniqueId(&id));
#endif
    KQLORA_CHECK_CUDA(cudaSetDevice(device_));
    KQLORA_CHECK_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
    KQLORA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KQLORA_CHECK_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    if (scratch_) cudaFree(scratch_);  // no throw from a destructor
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend() const override {
    return "NCCL";
  }
  bool device_buffers() const override {
    return true;
  }
#if KQLORA_HAVE_MPI
  MPI_Comm mpi_comm() const override {
    return MPI_COMM_WORLD;
  }  // its bootstrap
#endif

  std::unique_ptr<Request> broadcast(void* data, int64_t bytes, int root) override {
    auto r = begin("broadcast");
    Staged s(*this, data, bytes, data, bytes);
    KQLORA_CHECK_NCCL(
        ncclBroadcast(s.send, s.recv, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_));
    s.finish(*r);
    return end(std::move(r));
  }
  std::unique_ptr<Request> allreduce_sum(float* data, int64_t count) override {
    auto r = begin("allreduce");
    Staged s(*this, data, 4 * count, data, 4 * count);
    KQLORA_CHECK_NCCL(ncclAllReduce(s.send, s.recv, static_cast<size_t>(count), ncclFloat32,
                                    ncclSum, comm_, stream_));
    s.finish(*r);
    return end(std::move(r));
  }
  std::unique_ptr<Request> allreduce_sum(double* data, int64_t count) override {
    auto r = begin("allreduce");
    Staged s(*this, data, 8 * count, data, 8 * count);
    KQLORA_CHECK_NCCL(ncclAllReduce(s.send, s.recv, static_cast<size_t>(count), ncclFloat64,
                                    ncclSum, comm_, stream_));
    s.finish(*r);
    return end(std::move(r));
  }
  std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) override {
    auto r = begin("allgather");
    Staged s(*this, send, bytes, recv, bytes * size_);
    KQLORA_CHECK_NCCL(
        ncclAllGather(s.send, s.recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream_));
    s.finish(*r);
    return end(std::move(r));
  }
  std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                              int64_t count) override {
    KQLORA_CHECK(static_cast<const void*>(send) != static_cast<void*>(recv),
                 "NCCL reduce-scatter: in place is not supported (separate buffers)");
    auto r = begin("reduce-scatter");
    Staged s(*this, send, 4 * count * size_, recv, 4 * count);
    KQLORA_CHECK_NCCL(ncclReduceScatter(s.send, s.recv, static_cast<size_t>(count), ncclFloat32,
                                        ncclSum, comm_, stream_));
    s.finish(*r);
    return end(std::move(r));
  }

  bool test(Request& base) override {
    auto& r = static_cast<NcclRequest&>(base);
    if (r.done) return true;
    ncclResult_t async = ncclSuccess;
    KQLORA_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async));
    KQLORA_CHECK(
        !(async != ncclSuccess && async != ncclInProgress),
        "NCCL " << r.what << " failed on rank " << rank_ << ": " << ncclGetErrorString(async));
    const cudaError_t q = cudaEventQuery(r.done_event);
    if (q == cudaErrorNotReady) return false;
    KQLORA_CHECK_CUDA(q);
    if (r.pinned) {
      std::memcpy(r.host_dst, r.pinned, r.host_bytes);
      r.pool->release(r.pinned);
      r.pinned = nullptr;
    }
    r.done = true;
    return true;
  }

  /// After a timeout the communicator is unusable: abort it so no kernel stays stuck.
  void on_timeout() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  int device_;
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  ncclComm_t comm_ = nullptr;
  char* scratch_ = nullptr;  // device copies of host buffers
  PinnedPool pinned_;        // host results on their way out
  size_t scratch_bytes_ = 0;

  /// Device views of a collective's buffers: host ones copied into the scratch buffer (send
  /// at its start, receive after it) on the communication stream, and back by finish().
  struct Staged {
    NcclCommunicator& c;
    const void* send;
    void* recv;
    void* host_recv = nullptr;
    void* pinned = nullptr;
    size_t recv_bytes;
    Staged(NcclCommunicator& comm, const void* s, int64_t send_bytes, void* r, int64_t rb)
        : c(comm), send(s), recv(r), recv_bytes(static_cast<size_t>(rb)) {
      const bool host_send = !on_device(s), host_recv_buf = !on_device(r);
      if (!host_send && !host_recv_buf) return;
      // In place on the host (send == recv: broadcast, allreduce) the scratch holds one copy.
      const size_t sb = static_cast<size_t>(send_bytes),
                   need = s == r ? std::max(sb, recv_bytes) : sb + recv_bytes;
      if (need > c.scratch_bytes_) {
        {  // the old one may be in use by a collective that waits for a dead peer
          Watchdog::Guard guard(c, "wait for the communication stream (scratch growth)");
          KQLORA_CHECK_CUDA(cudaStreamSynchronize(c.stream_));
        }
        if (c.scratch_) KQLORA_CHECK_CUDA(cudaFree(c.scratch_));
        c.scratch_ = nullptr;
        KQLORA_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&c.scratch_), need));
        c.scratch_bytes_ = need;
      }
      if (host_send) {
        // (from pageable memory the copy returns only once the stream reaches it: behind a
        // collective stuck on a dead peer, so under the watchdog)
        Watchdog::Guard guard(c, "copy of " + std::to_string(sb) + " bytes to the device");
        KQLORA_CHECK_CUDA(cudaMemcpyAsync(c.scratch_, s, sb, cudaMemcpyHostToDevice, c.stream_));
        send = c.scratch_;
      }
      if (host_recv_buf) {
        host_recv = r;
        pinned = c.pinned_.acquire(recv_bytes);  // (before the collective is queued)
        recv = c.scratch_ + sb;
        // In place (send == recv on the host): the data to reduce is already in `send`.
        if (s == r) recv = const_cast<void*>(send);
      }
    }
    void finish(NcclRequest& req) {
      if (!host_recv) return;
      req.pool = &c.pinned_;
      req.pinned = pinned;
      req.host_dst = host_recv;
      req.host_bytes = recv_bytes;
      KQLORA_CHECK_CUDA(
          cudaMemcpyAsync(req.pinned, recv, recv_bytes, cudaMemcpyDeviceToHost, c.stream_));
    }
  };

  std::unique_ptr<NcclRequest> begin(const char* what) {
    auto r = std::make_unique<NcclRequest>();
    r->what = what;
    // The communication stream waits for what the compute stream has queued so far.
    KQLORA_CHECK_CUDA(cudaEventRecord(ready_, compute_));
    KQLORA_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    KQLORA_CHECK_CUDA(cudaEventCreateWithFlags(&r->done_event, cudaEventDisableTiming));
    return r;
  }
  std::unique_ptr<Request> end(std::unique_ptr<NcclRequest> r) {
    KQLORA_CHECK_CUDA(cudaEventRecord(r->done_event, stream_));
    return r;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(device, static_cast<cudaStream_t>(compute_stream),
                                            timeout_s);
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop;
  KQLORA_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  // GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L writes it.
  std::string id = "GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    id += hex[b >> 4];
    id += hex[b & 15];
  }
  return id;
}

}  // namespace kqlora
