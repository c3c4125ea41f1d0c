// The MPI backend of Communicator: non-blocking MPI-3 collectives on a duplicate of
// MPI_COMM_WORLD (or MPI_COMM_SELF), every call checked. Counts above INT_MAX go in pieces.
#include "kqlora/parallel/communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <vector>

#include "kqlora/core/mpi_check.hpp"

#if KQLORA_HAVE_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_Query_cuda_support
#endif
#endif

namespace kqlora {

#if KQLORA_HAVE_MPI
namespace {

std::string size_text(int64_t bytes) {
  std::ostringstream os;
  if (bytes >= (1 << 20))
    os << static_cast<double>(bytes) / (1 << 20) << " MiB";
  else
    os << bytes << " B";
  return os.str();
}

class MpiRequest : public Request {
 public:
  std::vector<MPI_Request> reqs;
};

/// Whether this MPI takes device pointers: KQLORA_GPU_AWARE_MPI=1/0 says so, else Open
/// MPI's run-time query where it has one; otherwise no (device data goes through the host).
bool gpu_aware_mpi() {
  if (const char* env = std::getenv("KQLORA_GPU_AWARE_MPI")) return std::string(env) == "1";
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(bool world) : gpu_aware_(gpu_aware_mpi()) {
    KQLORA_CHECK_MPI(MPI_Comm_dup(world ? MPI_COMM_WORLD : MPI_COMM_SELF, &comm_));
    KQLORA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    KQLORA_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    KQLORA_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // no throw from a destructor
  }
  const char* backend() const override { return "MPI"; }
  bool device_buffers() const override { return gpu_aware_; }
  bool nonblocking_device_buffers() const override { return false; }
  MPI_Comm mpi_comm() const override { return comm_; }

  std::unique_ptr<Request> broadcast(void* data, int64_t bytes, int root) override {
    auto r = start("broadcast of " + size_text(bytes));
    chunks(bytes, 1, [&](int64_t off, int n) {
      r->reqs.emplace_back();
      KQLORA_CHECK_MPI(
          MPI_Ibcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, comm_, &r->reqs.back()));
    });
    return r;
  }

  // Pieces: Open MPI's non-blocking allreduce of one large buffer runs at half the speed of
  // the blocking one, and both are fastest on pieces that stay in cache (measured here on
  // 64 MiB: whole 76 ms non-blocking / 35 ms blocking; 64 Ki-float pieces non-blocking
  // 33 ms; 1 Mi-float pieces blocking 13-16 ms).
  static constexpr int64_t nonblocking_piece = int64_t(1) << 16;
  static constexpr int64_t blocking_piece = int64_t(1) << 20;

  std::unique_ptr<Request> allreduce_sum(float* data, int64_t count) override {
    auto r = start("allreduce of " + size_text(4 * count));
    for (int64_t off = 0; off < count; off += nonblocking_piece) {
      r->reqs.emplace_back();
      KQLORA_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data + off,
                                      static_cast<int>(std::min(nonblocking_piece, count - off)),
                                      MPI_FLOAT, MPI_SUM, comm_, &r->reqs.back()));
    }
    return r;
  }

  void allreduce_sum_blocking(float* data, int64_t count) override {
    // A blocking call cannot time out by itself: the watchdog ends the process if it
    // outlasts the deadline (and the launcher then ends the job).
    Watchdog::Guard guard(*this, "blocking allreduce of " + size_text(4 * count));
    for (int64_t off = 0; off < count; off += blocking_piece) {
      KQLORA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data + off,
                                     static_cast<int>(std::min(blocking_piece, count - off)),
                                     MPI_FLOAT, MPI_SUM, comm_));
    }
  }

  std::unique_ptr<Request> allreduce_sum(double* data, int64_t count) override {
    auto r = start("allreduce of " + size_text(8 * count));
    chunks(count, 1, [&](int64_t off, int n) {
      r->reqs.emplace_back();
      KQLORA_CHECK_MPI(
          MPI_Iallreduce(MPI_IN_PLACE, data + off, n, MPI_DOUBLE, MPI_SUM, comm_, &r->reqs.back()));
    });
    return r;
  }

  std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) override {
    KQLORA_CHECK(bytes <= INT_MAX, "allgather of " << bytes << " bytes per rank: too large");
    auto r = start("allgather of " + size_text(bytes) + " per rank");
    r->reqs.emplace_back();
    // This rank's block already in place in recv: MPI's in-place form (buffers may not alias).
    const bool in_place = send == static_cast<const char*>(recv) + rank_ * bytes;
    KQLORA_CHECK_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(bytes),
                                    MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_,
                                    &r->reqs.back()));
    return r;
  }

  // A reduction to each rank of its block, in pieces: Open MPI's reduce-scatter allocates a
  // temporary of the whole send buffer per call (80 MB a step at the 7B shape under FSDP),
  // which malloc maps afresh every time: 20 thousand page faults a step. The pieces'
  // temporaries (1 MiB each, together still about the whole buffer while all are in
  // flight) come from the heap, which keeps them from step to step: about 100 faults a
  // call. Faster too: 0.05 against 0.10 s for 2 x 80 MB at np 2, 0.30 against 0.37 s at
  // np 4 (docs/BENCHMARKS.md, "Minor page faults a step").
  static constexpr int64_t reduce_piece = int64_t(1) << 18;

  std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                              int64_t count) override {
    auto r = start("reduce-scatter of " + size_text(4 * count) + " per rank");
    for (int root = 0; root < size_; ++root) {
      for (int64_t off = 0; off == 0 || off < count; off += reduce_piece) {
        const int n = static_cast<int>(std::min(reduce_piece, count - off));
        r->reqs.emplace_back();
        KQLORA_CHECK_MPI(MPI_Ireduce(send + root * count + off,
                                     root == rank_ ? recv + off : nullptr, n, MPI_FLOAT, MPI_SUM,
                                     root, comm_, &r->reqs.back()));
      }
    }
    return r;
  }

  std::unique_ptr<SharedMemory> allocate_shared(int64_t bytes) override;

  /// A non-blocking barrier (it has a deadline, unlike MPI_Barrier).
  std::unique_ptr<Request> barrier() {
    auto r = start("barrier");
    r->reqs.emplace_back();
    KQLORA_CHECK_MPI(MPI_Ibarrier(comm_, &r->reqs.back()));
    return r;
  }

  bool test(Request& base) override {
    auto& r = static_cast<MpiRequest&>(base);
    if (r.done) return true;
    int flag = 0;
    KQLORA_CHECK_MPI(
        MPI_Testall(static_cast<int>(r.reqs.size()), r.reqs.data(), &flag, MPI_STATUSES_IGNORE));
    r.done = flag != 0;
    return r.done;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool gpu_aware_ = false;

  static std::unique_ptr<MpiRequest> start(const std::string& what) {
    auto r = std::make_unique<MpiRequest>();
    r->what = what;
    return r;
  }

  /// Calls f(offset, count) over pieces of at most INT_MAX / ranks elements.
  template <class F>
  static void chunks(int64_t total, int ranks, F&& f) {
    const int64_t piece = INT_MAX / std::max(ranks, 1);
    if (total == 0) {
      f(0, 0);
      return;
    }
    for (int64_t off = 0; off < total; off += piece)
      f(off, static_cast<int>(std::min(piece, total - off)));
  }
};

/// An MPI-3 shared window, in a passive-target epoch for its whole life (MPI_Win_sync
/// then orders memory at each sync).
class MpiSharedMemory : public SharedMemory {
 public:
  MpiSharedMemory(MpiCommunicator& comm, int64_t bytes) : comm_(comm) {
    KQLORA_CHECK_MPI(MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL,
                                             comm.mpi_comm(), &base_, &win_));
    KQLORA_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
    for (int r = 0; r < comm.size(); ++r) {
      MPI_Aint size = 0;
      int unit = 0;
      void* p = nullptr;
      KQLORA_CHECK_MPI(MPI_Win_shared_query(win_, r, &size, &unit, &p));
      segments_.push_back(static_cast<char*>(p));
    }
  }
  ~MpiSharedMemory() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Win_unlock_all(win_);  // (local; no throw from a destructor)
    // Freeing is collective: not while an error unwinds this rank (the others are not
    // coming), and only after a barrier with a deadline (a dead rank must not hang us).
    if (std::uncaught_exceptions() > 0 || comm_.broken()) return;
    try {
      comm_.wait(comm_.barrier());
    } catch (...) {
      return;
    }
    // (A rank that timed out just after the barrier completed elsewhere will not come.)
    Watchdog::Guard guard(comm_, "shared-memory window free");
    MPI_Win_free(&win_);
  }
  char* segment(int rank) const override { return segments_[static_cast<size_t>(rank)]; }
  void sync() override {
    KQLORA_CHECK_MPI(MPI_Win_sync(win_));
    comm_.wait(comm_.barrier());
    KQLORA_CHECK_MPI(MPI_Win_sync(win_));
  }

 private:
  MpiCommunicator& comm_;
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
  std::vector<char*> segments_;
};

std::unique_ptr<SharedMemory> MpiCommunicator::allocate_shared(int64_t bytes) {
  Watchdog::Guard guard(*this, "shared-memory window allocation");
  // Shared memory only when every rank is on this node (the same answer on every rank).
  MPI_Comm node = MPI_COMM_NULL;
  KQLORA_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int node_size = 0;
  KQLORA_CHECK_MPI(MPI_Comm_size(node, &node_size));
  KQLORA_CHECK_MPI(MPI_Comm_free(&node));
  if (node_size != size_) return nullptr;
  return std::make_unique<MpiSharedMemory>(*this, bytes);
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(bool world) {
  return std::make_unique<MpiCommunicator>(world);
}
#else
std::unique_ptr<Communicator> make_mpi_communicator(bool) {
  KQLORA_CHECK(false, "this kqlora was built without MPI");
}
#endif

}  // namespace kqlora
