#pragma once
// IEEE binary16 -> float32 (exact), for reading float16 checkpoints.

#include <cstdint>

namespace kqlora {

float half_to_float(uint16_t h);

}  // namespace kqlora
