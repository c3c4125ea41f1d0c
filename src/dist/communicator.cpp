#include "kqlora/dist/communicator.hpp"

#include <unistd.h>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "kqlora/core/error.hpp"

#include <sstream>

namespace kqlora::dist {

namespace {

// One watchdog thread per process, started on first use.
struct WatchdogState {
  std::mutex m;
  std::condition_variable cv;
  bool armed = false;
  std::chrono::steady_clock::time_point deadline;
  std::string message;
  std::thread thread;

  WatchdogState() {
    thread = std::thread([this] {
      std::unique_lock<std::mutex> lock(m);
      for (;;) {
        if (!armed) {
          cv.wait(lock);
          continue;
        }
        if (cv.wait_until(lock, deadline) == std::cv_status::timeout && armed &&
            std::chrono::steady_clock::now() >= deadline) {
          std::fprintf(stderr, "kqlora: error: %s\n", message.c_str());
          std::fflush(stderr);
          _exit(1);  // the launcher sees a failed rank and ends the job
        }
      }
    });
    thread.detach();
  }
};

WatchdogState& watchdog() {
  static WatchdogState* w = new WatchdogState();  // never destroyed: the thread outlives main
  return *w;
}

}  // namespace

Watchdog::Guard::Guard(const Communicator& comm, const std::string& what) {
  auto& w = watchdog();
  std::lock_guard<std::mutex> lock(w.m);
  w.armed = true;
  w.deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(comm.timeout()));
  std::ostringstream os;
  os << comm.backend() << " " << what << " did not complete within " << comm.timeout()
     << " s (comm_timeout_s) on rank " << comm.rank() << " of " << comm.size()
     << ": another rank is hung or dead";
  w.message = os.str();
  w.cv.notify_all();
}

Watchdog::Guard::~Guard() {
  auto& w = watchdog();
  std::lock_guard<std::mutex> lock(w.m);
  w.armed = false;
  w.cv.notify_all();
}

void Communicator::wait(Request& r) {
  if (r.done) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = r.started + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(timeout_s_));
  int spins = 0;
  while (!test(r)) {
    if (Clock::now() > deadline) {
      on_timeout();
      KQLORA_THROW_IF(true, backend() << " " << r.what << " did not complete within " << timeout_s_
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

}  // namespace kqlora::dist
