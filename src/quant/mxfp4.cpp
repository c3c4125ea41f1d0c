// MXFP4 decoding (quant/mxfp4.hpp).
#include "kqlora/quant/mxfp4.hpp"

#include <cmath>

#include "kqlora/core/error.hpp"

namespace kqlora {

float fp4_value(int code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 15];
}

void mxfp4_decode(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                  float* out, const std::string& where) {
  KQLORA_CHECK(cols % 32 == 0, where << ": MXFP4 rows of " << cols << " values");
  const int64_t groups = cols / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t scale = scales[r * groups + g];
      KQLORA_INPUT_CHECK(scale != 255, where << ": MXFP4 scale byte 255 (E8M0's NaN) at row " << r
                                             << ", block " << g);
      const int e = static_cast<int>(scale) - 127;
      const uint8_t* b = blocks + (r * groups + g) * 16;
      float* o = out + r * cols + g * 32;
      for (int i = 0; i < 16; ++i) {
        o[2 * i] = std::ldexp(fp4_value(b[i] & 15), e);
        o[2 * i + 1] = std::ldexp(fp4_value(b[i] >> 4), e);
      }
      for (int i = 0; i < 32; ++i)
        KQLORA_INPUT_CHECK(std::isfinite(o[i]), where << ": MXFP4 value at row " << r << ", column "
                                                      << g * 32 + i << " decodes to " << o[i]
                                                      << " (scale byte " << int(scale)
                                                      << ": past float32's range)");
    }
}

}  // namespace kqlora
