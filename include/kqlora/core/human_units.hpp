#pragma once
// Sizes and durations for log lines: "12.3 MiB", "1.25s".

#include <string>

namespace kqlora {

std::string human_bytes(double bytes);
std::string human_time(double seconds);

}  // namespace kqlora
