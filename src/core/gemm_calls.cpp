#include "kqlora/core/gemm_calls.hpp"

#include <atomic>

namespace kqlora {

namespace {
std::atomic<uint64_t> calls{0};
}  // namespace

uint64_t gemm_calls() {
  return calls.load(std::memory_order_relaxed);
}

void impl::count_gemm_call() noexcept {
  calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kqlora
