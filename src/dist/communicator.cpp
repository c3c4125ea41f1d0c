#include "kqlora/dist/communicator.hpp"

#include <cstring>
#include <thread>

#include "kqlora/core/error.hpp"

namespace kqlora::dist {

void Communicator::wait(Request& r) {
  if (r.done) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = r.started + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(timeout_s_));
  int spins = 0;
  while (!test(r)) {
    if (Clock::now() > deadline) {
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
