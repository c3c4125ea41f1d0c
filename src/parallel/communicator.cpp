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
        const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
        if (d != 0 && now > d) {
          std::lock_guard<std::mutex> lock(m);
          std::fprintf(stderr, "kqlora: error: %s\n", message.c_str());
          std::fflush(stderr);
          _exit(1);  // the launcher sees a failed rank and ends the job
        }
      }
    }).detach();
  }
};

WatchdogState& watchdog() {
  static WatchdogState* w = new WatchdogState();  // never destroyed: the thread outlives main
  return *w;
}

}  // namespace

Watchdog::Guard::Guard(const Communicator& comm, const std::string& what) {
  auto& w = watchdog();
  {
    std::lock_guard<std::mutex> lock(w.m);
    std::ostringstream os;
    os << comm.backend() << " " << what << " did not complete within " << comm.timeout()
       << " s (comm_timeout_s) on rank " << comm.rank() << " of " << comm.size()
       << ": another rank is hung or dead";
    w.message = os.str();
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(comm.timeout()));
  w.deadline_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
}

Watchdog::Guard::~Guard() {
  watchdog().deadline_ns = 0;
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
