#pragma once
// IEEE binary16 <-> float32: reading float16 checkpoints (exact), writing float16 files
// (rounded to nearest even, as NumPy's astype(float16)).

#include <cstdint>

namespace kqlora {

float half_to_float(uint16_t h);
/// float32 -> binary16, rounded to nearest even; NaN stays a quiet NaN, overflow is Inf.
uint16_t float_to_half(float f);

}  // namespace kqlora
