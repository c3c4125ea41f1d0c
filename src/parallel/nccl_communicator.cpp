// The NCCL backend of Communicator (built with KQLORA_ENABLE_NCCL): collectives on
// device memory, on a communication stream that waits for the compute stream Kokkos uses
// (an event recorded there), so they overlap the compute that follows. Bootstrapped from
// MPI the nccl-tests way: rank 0 calls ncclGetUniqueId, MPI_Bcast of the id,
// ncclCommInitRank on the GPU Kokkos selected; a build without MPI is a world of one (its
// own id, no broadcast). NCCL counts are elements. Buffers in host memory (the trainer's
// loss and norm scalars, host-staged data) go through page-locked memory and a device
// scratch buffer, both bounded (kNcclStagingBytes; larger collectives stream through them
// in pieces): every call site works with either kind of memory. Every CUDA and
// NCCL call is checked; a wait past the deadline aborts the communicator (ncclCommAbort)
// and throws.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kqlora/build_config.hpp"
#include "kqlora/core/cuda_check.hpp"
#include "kqlora/core/error.hpp"
#if KQLORA_HAVE_MPI
#include "kqlora/core/mpi_check.hpp"
#endif
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/parallel/nccl_communicator.hpp"
#include "kqlora/parallel/staging_plan.hpp"

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
/// Blocks are powers of two from 64 KiB up to kNcclStagingBytes; a new block replaces the
/// idle smaller ones, so what the pool holds stays near the bound times the blocks in use.
class PinnedPool {
 public:
  explicit PinnedPool(const Communicator& comm) : comm_(comm) {}
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
    size_t size = size_t(64) << 10;
    while (size < bytes) size *= 2;
    size = std::max(bytes, std::min(size, static_cast<size_t>(kNcclStagingBytes)));
    // (each call below waits for the device: behind a collective stuck on a dead peer)
    Watchdog::Guard guard(comm_,
                          "page-locked staging growth to " + std::to_string(size) + " bytes");
    for (size_t i = blocks_.size(); i-- > 0;)
      if (!blocks_[i].busy && blocks_[i].bytes < size) {
        KQLORA_CHECK_CUDA(cudaFreeHost(blocks_[i].p));
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    void* p = nullptr;
    KQLORA_CHECK_CUDA(cudaMallocHost(&p, size));
    blocks_.push_back({p, size, true});
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
  const Communicator& comm_;
  std::vector<Block> blocks_;
};

class NcclRequest : public Request {
 public:
  cudaEvent_t done_event = nullptr;
  bool recorded = false;  // done_event queued after the request's last operation
  // Host buffers pass through page-locked memory (truly asynchronous copies, so no call
  // blocks past the deadline); a host result is copied out once the request completes.
  PinnedPool* pool = nullptr;
  void* pinned = nullptr;
  void* host_dst = nullptr;
  size_t host_bytes = 0;
  ~NcclRequest() override {
    // A pinned buffer goes back to the pool only once its copy is done; otherwise it stays
    // taken (a timed-out collective may still write it).
    // (an event never recorded reports success: a request abandoned half-queued keeps its
    // block, which a queued copy may still read)
    if (pinned && recorded && cudaEventQuery(done_event) == cudaSuccess) pool->release(pinned);
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
    // (no throw from a destructor) After a timeout, with an operation never seen complete
    // (an error left it), or while an error unwinds, operations may still wait for a peer
    // that will never come: abort them first, since ncclCommDestroy and cudaFree would wait
    // for them; otherwise every operation completed, and the communicator ends normally.
    if (comm_) {
      if (broken() || unfinished_ > 0 || std::uncaught_exceptions() > 0)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (scratch_) cudaFree(scratch_);
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
    return collective("broadcast", Shape::in_place, data, data, bytes, 1,
                      [&](const void* in, void* out, int64_t n) {
                        KQLORA_CHECK_NCCL(ncclBroadcast(in, out, static_cast<size_t>(n), ncclUint8,
                                                        root, comm_, stream_));
                      });
  }
  std::unique_ptr<Request> allreduce_sum(float* data, int64_t count) override {
    return collective("allreduce", Shape::in_place, data, data, 4 * count, 4,
                      [&](const void* in, void* out, int64_t n) {
                        KQLORA_CHECK_NCCL(ncclAllReduce(in, out, static_cast<size_t>(n / 4),
                                                        ncclFloat32, ncclSum, comm_, stream_));
                      });
  }
  std::unique_ptr<Request> allreduce_sum(double* data, int64_t count) override {
    return collective("allreduce", Shape::in_place, data, data, 8 * count, 8,
                      [&](const void* in, void* out, int64_t n) {
                        KQLORA_CHECK_NCCL(ncclAllReduce(in, out, static_cast<size_t>(n / 8),
                                                        ncclFloat64, ncclSum, comm_, stream_));
                      });
  }
  std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) override {
    return collective("allgather", Shape::gather, send, recv, bytes, 1,
                      [&](const void* in, void* out, int64_t n) {
                        KQLORA_CHECK_NCCL(ncclAllGather(in, out, static_cast<size_t>(n), ncclUint8,
                                                        comm_, stream_));
                      });
  }
  std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                              int64_t count) override {
    KQLORA_CHECK(static_cast<const void*>(send) != static_cast<void*>(recv),
                 "NCCL reduce-scatter: in place is not supported (separate buffers)");
    return collective("reduce-scatter", Shape::scatter, send, recv, 4 * count, 4,
                      [&](const void* in, void* out, int64_t n) {
                        KQLORA_CHECK_NCCL(ncclReduceScatter(in, out, static_cast<size_t>(n / 4),
                                                            ncclFloat32, ncclSum, comm_, stream_));
                      });
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
      if (r.host_dst) std::memcpy(r.host_dst, r.pinned, r.host_bytes);
      r.pool->release(r.pinned);
      r.pinned = nullptr;
    }
    r.done = true;
    --unfinished_;
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
  char* scratch_ = nullptr;   // device copies of host buffers (at most kNcclStagingBytes)
  PinnedPool pinned_{*this};  // host data on its way in and out (blocks of at most that)
  size_t scratch_bytes_ = 0;
  int64_t unfinished_ = 0;  // requests begun and not yet seen complete

  /// Where a collective's blocks lie (each rank's block: `block_bytes` of the call).
  enum class Shape {
    in_place,  // send == recv, one block (broadcast, all-reduce)
    gather,    // one block sent, a block per rank received (all-gather)
    scatter,   // a block per rank sent, one received (reduce-scatter)
  };

  /// The device scratch buffer, at least `bytes` (<= kNcclStagingBytes).
  char* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      {  // the old one may be in use by a collective that waits for a dead peer
        Watchdog::Guard guard(*this, "wait for the communication stream (scratch growth)");
        KQLORA_CHECK_CUDA(cudaStreamSynchronize(stream_));
      }
      if (scratch_) KQLORA_CHECK_CUDA(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      KQLORA_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  /// Runs `run(device_send, device_recv, piece_bytes)` (the NCCL call) over the buffers.
  /// Device buffers go to NCCL as they are. Host ones are copied through page-locked memory
  /// (every copy truly asynchronous) and the scratch buffer: a collective that fits the
  /// staging bound is one queued operation, completed by test(); a larger one streams
  /// through the bound in pieces (staging_plan.hpp), each waited for within the deadline.
  template <class Run>
  std::unique_ptr<Request> collective(const char* what, Shape shape, const void* send, void* recv,
                                      int64_t block_bytes, int64_t element_bytes, Run run) {
    auto r = begin(what);
    const bool host_send = !on_device(send), host_recv = !on_device(recv);
    if (!host_send && !host_recv) {
      run(send, recv, block_bytes);
      return end(std::move(r));
    }
    const int64_t send_blocks = shape == Shape::scatter ? size_ : 1,
                  recv_blocks = shape == Shape::gather ? size_ : 1,
                  staged_blocks = shape == Shape::in_place ? 1 : send_blocks + recv_blocks;
    // (every rank must make the same NCCL calls: the pieces depend on the size and on
    // where the buffers lie, which every call site chooses alike on every rank)
    const std::vector<StagingPiece> pieces =
        staging_pieces(block_bytes, staged_blocks, element_bytes, kNcclStagingBytes);
    if (pieces.size() == 1) {
      const size_t sb = static_cast<size_t>(send_blocks * block_bytes),
                   rb = static_cast<size_t>(recv_blocks * block_bytes);
      char* dev = scratch(shape == Shape::in_place ? sb : sb + rb);
      // One page-locked block carries the send data in and the result out (stream order:
      // the copy in is done before the copy out starts). Taken before anything is queued.
      r->pool = &pinned_;
      r->pinned = pinned_.acquire(std::max(host_send ? sb : 0, host_recv ? rb : 0));
      const void* dsend = send;
      void* drecv = recv;
      if (host_send) {
        std::memcpy(r->pinned, send, sb);
        KQLORA_CHECK_CUDA(cudaMemcpyAsync(dev, r->pinned, sb, cudaMemcpyHostToDevice, stream_));
        dsend = dev;
      }
      if (host_recv) drecv = shape == Shape::in_place ? dev : dev + (host_send ? sb : 0);
      run(dsend, drecv, block_bytes);
      if (host_recv) {
        r->host_dst = recv;
        r->host_bytes = rb;
        KQLORA_CHECK_CUDA(cudaMemcpyAsync(r->pinned, drecv, rb, cudaMemcpyDeviceToHost, stream_));
      }
      return end(std::move(r));
    }
    // In pieces: within the bound, whatever the size (docs/GPU.md).
    KQLORA_CHECK(host_send && host_recv,
                 "NCCL " << what << " of " << block_bytes
                         << " bytes a rank: buffers on the host and on the device at once, "
                            "larger than the staging bound");
    const int64_t most = pieces[0].bytes;
    char* dev = scratch(static_cast<size_t>(staged_blocks * most));
    void* pinned = pinned_.acquire(static_cast<size_t>(std::max(send_blocks, recv_blocks) * most));
    char* host = static_cast<char*>(pinned);
    for (const StagingPiece& p : pieces) {
      auto step = begin(what);
      const size_t sb = static_cast<size_t>(send_blocks * p.bytes),
                   rb = static_cast<size_t>(recv_blocks * p.bytes);
      if (shape == Shape::scatter)
        pack_piece(static_cast<const char*>(send), block_bytes, size_, p, host);
      else
        std::memcpy(host, static_cast<const char*>(send) + p.offset, sb);
      KQLORA_CHECK_CUDA(cudaMemcpyAsync(dev, host, sb, cudaMemcpyHostToDevice, stream_));
      char* drecv = shape == Shape::in_place ? dev : dev + sb;
      run(dev, drecv, p.bytes);
      KQLORA_CHECK_CUDA(cudaMemcpyAsync(host, drecv, rb, cudaMemcpyDeviceToHost, stream_));
      wait(*end(std::move(step)));  // (within comm_timeout_s; a timeout aborts and throws)
      if (shape == Shape::gather)
        unpack_piece(host, block_bytes, size_, p, static_cast<char*>(recv));
      else
        std::memcpy(static_cast<char*>(recv) + p.offset, host, rb);
    }
    pinned_.release(pinned);
    r->done = true;
    --unfinished_;
    return end(std::move(r));
  }

  std::unique_ptr<NcclRequest> begin(const char* what) {
    KQLORA_CHECK(comm_, "NCCL " << what << " on rank " << rank_
                                << ": the communicator was aborted after a timeout");
    auto r = std::make_unique<NcclRequest>();
    ++unfinished_;
    r->what = what;
    // The communication stream waits for what the compute stream has queued so far.
    KQLORA_CHECK_CUDA(cudaEventRecord(ready_, compute_));
    KQLORA_CHECK_CUDA(cudaStreamWaitEvent(stream_, ready_, 0));
    KQLORA_CHECK_CUDA(cudaEventCreateWithFlags(&r->done_event, cudaEventDisableTiming));
    return r;
  }
  std::unique_ptr<Request> end(std::unique_ptr<NcclRequest> r) {
    KQLORA_CHECK_CUDA(cudaEventRecord(r->done_event, stream_));
    r->recorded = true;
    return r;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int device, void* compute_stream,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(device, static_cast<cudaStream_t>(compute_stream),
                                            timeout_s);
}

void nccl_warm_up(Communicator& comm, int64_t bytes, bool gathers) {
  // Two sizes: one element, and `bytes` (NCCL picks its algorithm and protocol by size and
  // sets each one's connections and buffers up at its first use). Device buffers, so
  // nothing is staged; their contents do not matter (sums of whatever is there, dropped).
  // Every wait is the communicator's: within comm_timeout_s, or an error naming it.
  const int n = comm.size();
  const int64_t count = std::max<int64_t>(n, std::min(bytes, kNcclStagingBytes) / 4);
  const int64_t block = count / n;  // (a rank's block of the gathers: n * block <= count)
  float* d = nullptr;
  KQLORA_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float) * 2 * count));
  float* const a = d;          // [count]: the all-reduce; the gathers' one-block side
  float* const b = d + count;  // [count]: the gathers' n-block side
  try {
    for (const int64_t c : {int64_t(1), count}) {
      comm.wait(comm.allreduce_sum(a, c));
      if (!gathers) continue;
      const int64_t k = c == 1 ? 1 : block;
      comm.wait(comm.allgather(a, b, 4 * k));
      comm.wait(comm.reduce_scatter_sum(b, a, k));
    }
  } catch (...) {
    // (a timed-out collective may still write the buffer: it stays allocated; unchecked:
    // the error in flight is the one to report)
    if (!comm.broken()) cudaFree(d);
    throw;
  }
  KQLORA_CHECK_CUDA(cudaFree(d));
}

}  // namespace kqlora
