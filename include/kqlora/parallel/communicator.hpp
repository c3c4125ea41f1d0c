#pragma once
// Collectives for data-parallel training, behind one interface with two backends: MPI
// (host memory, or device memory with a GPU-aware MPI) and NCCL (device memory, on the
// stream Kokkos uses; bootstrapped from MPI). Operations are asynchronous: start one, keep
// computing, test() it between layers to drive progress, wait() for it. Every wait has a
// deadline (comm_timeout_s): a hung or dead rank turns into an error naming the operation,
// not a hang.

#include "kqlora/build_config.hpp"

#if KQLORA_HAVE_MPI
#include <mpi.h>
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace kqlora {

class Communicator;

/// Ends the job when a blocking call outlasts its deadline: a thread that waits for the
/// deadline unless the guarded call returns first, then prints the guard's line and calls
/// MPI_Abort(MPI_COMM_WORLD, 1) (the launcher ends every rank, exit 1; `_exit(1)` where MPI
/// is not running, or if MPI_Abort has not ended the process 10 s later). Guards nest on
/// one thread: the inner one's deadline holds until it ends, then the outer one's again.
class Watchdog {
 public:
  class Guard {
   public:
    /// A blocking call of `comm`, within its timeout (comm_timeout_s); `what` names it.
    Guard(const Communicator& comm, const std::string& what);
    /// Any blocking section: `seconds` from now, then `message` is the line printed.
    Guard(double seconds, const std::string& message);
    ~Guard();
    /// Replaces the line printed (the phase a long section has reached); same deadline.
    void set_message(const std::string& message);
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    void arm(double seconds, const std::string& message);
    int64_t outer_deadline_ns_ = 0;
    std::string outer_message_;
  };
};

/// A collective in flight.
class Request {
 public:
  virtual ~Request() = default;
  std::string what;  // "allreduce of 4.0 MiB", for messages
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  bool done = false;
};

/// Host memory that every rank of a communicator reads and writes directly (MPI-3
/// shared windows, where all ranks run on one node). Each rank contributes a segment;
/// the segments lie end to end in rank order, so segment(0) starts the whole.
class SharedMemory {
 public:
  virtual ~SharedMemory() = default;
  virtual char* segment(int rank) const = 0;
  /// A barrier that also orders memory: every rank's writes before it are visible to every
  /// rank after it. Waits at most the communicator's timeout.
  virtual void sync() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;
  /// Whether collectives take device pointers (host ones work too): NCCL (host buffers
  /// staged), or a GPU-aware MPI (Open MPI's query, or KQLORA_GPU_AWARE_MPI=1). Otherwise
  /// callers stage device data through the host.
  virtual bool device_buffers() const { return false; }
  /// Whether the non-blocking collectives take device pointers too: NCCL's do; a GPU-aware
  /// MPI's need not (Open MPI's CUDA support covers blocking collectives only), so DDP
  /// reduces device buckets with blocking calls there.
  virtual bool nonblocking_device_buffers() const { return device_buffers(); }

  /// Seconds a wait may last before it throws (comm_timeout_s).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  /// Whether a wait has run out of time: the other ranks are not to be waited for again
  /// (clean-up skips its collectives).
  bool broken() const { return broken_; }

  /// Root's bytes into every rank's buffer.
  virtual std::unique_ptr<Request> broadcast(void* data, int64_t bytes, int root) = 0;
  /// In-place sum of float32 values over ranks (started now, completed by test/wait).
  virtual std::unique_ptr<Request> allreduce_sum(float* data, int64_t count) = 0;
  /// The same, blocking until done: on CPUs, where a reduction's arithmetic runs on the
  /// cores that compute anyway, often faster than a non-blocking one (docs/BENCHMARKS.md).
  virtual void allreduce_sum_blocking(float* data, int64_t count) {
    wait(allreduce_sum(data, count));
  }
  /// In-place sum of float64 values (scalars: losses, norms).
  virtual std::unique_ptr<Request> allreduce_sum(double* data, int64_t count) = 0;
  /// Every rank's `bytes` from `send` into recv[rank * bytes ...].
  virtual std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) = 0;
  /// Sum over ranks of send[r * count ...] into rank r's recv[0 .. count); send and recv
  /// must not overlap.
  virtual std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                                      int64_t count) = 0;

#if KQLORA_HAVE_MPI
  /// The MPI communicator of these ranks (parallel HDF5 opens shared files on it).
  virtual MPI_Comm mpi_comm() const {
    return MPI_COMM_SELF;
  }
#endif

  /// Collective: `bytes` of shared host memory from this rank, visible to all ranks; null
  /// (on every rank) where the ranks do not all share a node or the backend has none.
  virtual std::unique_ptr<SharedMemory> allocate_shared(int64_t /*bytes*/) {
    return nullptr;
  }

  /// Called when a wait runs out of time, before the error: a backend whose operations
  /// could stay stuck on a device cancels them here.
  virtual void on_timeout() {}

  /// Drives progress; true once the request is complete.
  virtual bool test(Request& r) = 0;
  /// Waits for completion; throws kqlora::Error naming the operation after timeout().
  void wait(Request& r);
  /// Blocking forms.
  void wait(std::unique_ptr<Request> r) {
    wait(*r);
  }

 protected:
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
  bool broken_ = false;
};

/// The MPI backend over a duplicate of MPI_COMM_WORLD (or of MPI_COMM_SELF: a world of one,
/// e.g. a reference run inside an MPI test).
std::unique_ptr<Communicator> make_mpi_communicator(bool world = true);
/// One process, no MPI: collectives are copies. For builds without MPI.
std::unique_ptr<Communicator> make_self_communicator();

}  // namespace kqlora
