#pragma once
// Wall time since a point of the steady clock, in seconds (the phases, waits and set-up
// times the logs report).

#include <chrono>

namespace kqlora {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace kqlora
