#include "kqlora/core/signals.hpp"

#include <csignal>

namespace kqlora {

namespace {
volatile std::sig_atomic_t flag = 0;
extern "C" void on_stop_signal(int) {
  flag = 1;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not make an MPI or file call fail
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool stop_requested() {
  return flag != 0;
}
void request_stop() {
  flag = 1;
}
void clear() {
  flag = 0;
}

}  // namespace kqlora
