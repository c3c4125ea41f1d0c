#include "kqlora/parallel/communicator.hpp"

#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "kqlora/core/error.hpp"

#include <sstream>

namespace kqlora {

namespace {

// One watchdog thread per process, started on first use. Guards only store a deadline
// (no lock, no wake-up: a blocking collective must not pay for its guard); the thread looks
// at it ten times a second.
struct WatchdogState {
  std::atomic<int64_t> deadline_ns{0};  // 0: disarmed
  std::mutex m;                         // guards `message`
  std::string message;

  WatchdogState() {
    std::thread([this] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const int64_t d = deadline_ns.load();
        if (d != 0 && now_ns() > d) {
          std::lock_guard<std::mutex> lock(m);
          if (deadline_ns.load() != d) continue;  // the guard ended meanwhile
          std::fprintf(stderr, "kqlora: error: %s\n", message.c_str());
          std::fflush(stderr);
          end_job();
        }
      }
    }).detach();
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The main thread is blocked inside MPI (or a device wait): only MPI_Abort makes the
  // launcher end the other ranks too, whatever its options (srun without
  // --kill-on-bad-exit would leave them running after a plain exit). A second thread
  // exits after 10 s in case MPI_Abort itself does not come back.
  [[noreturn]] static void end_job() {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      _exit(1);
    }).detach();
#if KQLORA_HAVE_MPI
    int initialized = 0, finalized = 0;
    if (MPI_Initialized(&initialized) == MPI_SUCCESS && initialized &&
        MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
      MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    _exit(1);
  }
};

WatchdogState& watchdog() {
  static WatchdogState* w = new WatchdogState();  // never destroyed: the thread outlives main
  return *w;
}

}  // namespace

Watchdog::Guard::Guard(const Communicator& comm, const std::string& what) {
  std::ostringstream os;
  os << comm.backend() << " " << what << " did not complete within " << comm.timeout()
     << " s (comm_timeout_s) on rank " << comm.rank() << " of " << comm.size()
     << ": another rank is hung or dead";
  arm(comm.timeout(), os.str());
}

Watchdog::Guard::Guard(double seconds, const std::string& message) {
  arm(seconds, message);
}

void Watchdog::Guard::arm(double seconds, const std::string& message) {
  auto& w = watchdog();
  outer_deadline_ns_ = w.deadline_ns.exchange(0);  // (disarmed while the message changes)
  {
    std::lock_guard<std::mutex> lock(w.m);
    outer_message_ = std::move(w.message);
    w.message = message;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  w.deadline_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
}

void Watchdog::Guard::set_message(const std::string& message) {
  auto& w = watchdog();
  std::lock_guard<std::mutex> lock(w.m);
  w.message = message;
}

Watchdog::Guard::~Guard() {
  auto& w = watchdog();
  w.deadline_ns = 0;
  {
    std::lock_guard<std::mutex> lock(w.m);
    w.message = std::move(outer_message_);
  }
  w.deadline_ns = outer_deadline_ns_;  // the enclosing guard's, or 0: disarmed
}

void Communicator::wait(Request& r) {
  if (r.done) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = r.started + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(timeout_s_));
  int spins = 0;
  while (!test(r)) {
    if (Clock::now() > deadline) {
      broken_ = true;
      on_timeout();
      KQLORA_CHECK(false, backend() << " " << r.what << " did not complete within " << timeout_s_
                                    << " s (comm_timeout_s) on rank " << rank_ << " of " << size_
                                    << ": another rank is hung or dead");
    }
    // Spin briefly (collectives usually finish fast), then yield the core to the other
    // ranks that share it.
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

namespace {

class SelfCommunicator : public Communicator {
 public:
  const char* backend() const override { return "self"; }
  std::unique_ptr<Request> broadcast(void*, int64_t, int) override { return done(); }
  std::unique_ptr<Request> allreduce_sum(float*, int64_t) override { return done(); }
  std::unique_ptr<Request> allreduce_sum(double*, int64_t) override { return done(); }
  std::unique_ptr<Request> allgather(const void* send, void* recv, int64_t bytes) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
    return done();
  }
  std::unique_ptr<Request> reduce_scatter_sum(const float* send, float* recv,
                                              int64_t count) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(count) * sizeof(float));
    return done();
  }
  bool test(Request&) override { return true; }

 private:
  static std::unique_ptr<Request> done() {
    auto r = std::make_unique<Request>();
    r->done = true;
    return r;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace kqlora
