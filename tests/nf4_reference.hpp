#pragma once
// A plain scalar NF4 reference written from docs/NF4.md, for sizes torchao refuses (partial
// scaler blocks, all-zero blocks). It computes all 16 distances (no interval trick) and
// the mean in long double, so it shares no shortcut with the kernels.

#include <cmath>
#include <cstdint>
#include <vector>

#include "kqlora/core/bfloat16.hpp"

namespace nf4ref {

inline const double literals[16] = {-1.0,    -0.6962, -0.5251, -0.3949, -0.2844, -0.1848,
                                    -0.0911, 0.0,     0.0796,  0.1609,  0.2461,  0.3379,
                                    0.4407,  0.5626,  0.7230,  1.0};

struct Result {
  std::vector<uint8_t> data;
  std::vector<int8_t> scalers;
  std::vector<float> factors;
  float mean = 0;
  std::vector<float> dequantized;
};

// Rounds a float32 result to the dtype (identity for float32).
inline float rd(float x, bool bf16) {
  return bf16 ? kqlora::round_to_bf16(x) : x;
}

inline Result quantize(const std::vector<float>& x, int64_t bs, int64_t sbs, bool bf16) {
  const int64_t n = static_cast<int64_t>(x.size()), nb = n / bs, nsb = (nb + sbs - 1) / sbs;
  float cb[16];
  for (int k = 0; k < 16; ++k) cb[k] = rd(static_cast<float>(literals[k]), bf16);
  Result r;
  std::vector<float> absmax(nb);
  long double sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    float m = 0;
    for (int64_t i = 0; i < bs; ++i) m = std::max(m, std::fabs(x[b * bs + i]));
    absmax[b] = m;
    sum += m;
  }
  const long double mean = sum / nb;
  r.mean = bf16 ? static_cast<float>(kqlora::bf16_from_double(static_cast<double>(mean)))
                : static_cast<float>(mean);
  r.scalers.resize(nb);
  r.factors.resize(nsb);
  for (int64_t g = 0; g < nsb; ++g) {
    const int64_t end = std::min(nb, (g + 1) * sbs);
    float amax = 0;
    for (int64_t i = g * sbs; i < end; ++i)
      amax = std::max(amax, std::fabs(rd(absmax[i] - r.mean, bf16)));
    const float f = amax > 0 ? rd(rd(1.0f / rd(2 * amax, bf16), bf16) * 256.0f, bf16) : 1.0f;
    r.factors[g] = f;
    for (int64_t i = g * sbs; i < end; ++i) {
      const float q = std::nearbyint(rd(rd(absmax[i] - r.mean, bf16) * f, bf16));
      r.scalers[i] = static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, q)));
    }
  }
  std::vector<int> codes(n);
  for (int64_t i = 0; i < n; ++i) {
    const float a = absmax[i / bs];
    if (a == 0) {
      codes[i] = 7;
      continue;
    }
    const float v = rd(x[i] / a, bf16);
    int best = 0;
    float bd = INFINITY;
    for (int k = 0; k < 16; ++k) {
      const float d = rd(std::fabs(v - cb[k]), bf16);
      if (d < bd) {
        bd = d;
        best = k;
      }
    }
    codes[i] = best;
  }
  r.data.resize(n / 2);
  for (int64_t j = 0; j < n / 2; ++j)
    r.data[j] = static_cast<uint8_t>(codes[2 * j] << 4 | codes[2 * j + 1]);
  r.dequantized.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / bs;
    const float s = rd(rd(r.scalers[b] / r.factors[b / sbs], bf16) + r.mean, bf16);
    r.dequantized[i] = rd(cb[codes[i]] * s, bf16);
  }
  return r;
}

}  // namespace nf4ref
