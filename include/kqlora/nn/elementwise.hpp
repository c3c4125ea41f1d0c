#pragma once
// Element-wise kernels of the LoRA model: activations, dropout, bias, bfloat16 rounding,
// losses. Each is a labelled Kokkos kernel over a [tokens, features] matrix (row-major).

#include <Kokkos_Core.hpp>

#include <cmath>
#include <string>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/fast_exp.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/core/random.hpp"
#include "kqlora/nn/linear_nf4.hpp"

namespace kqlora {

enum class Activation { none, relu, gelu, silu, gelu_tanh };
Activation parse_activation(const std::string& s);

/// tanh(u) = 1 - 2 / (exp(2u) + 1) through fast_exp (a loop over it vectorises): within
/// 2e-7 of tanh absolutely, which is what the activations that add it to 1 need (not a
/// relative accuracy near 0).
KOKKOS_FORCEINLINE_FUNCTION float tanh_via_exp(float u) {
  return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f);
}

/// tanh(z) within a few ulp, inline so that loops over it vectorise (libm's tanhf is a call
/// per element, over every logit of a Gemma vocabulary in the final soft-cap:
/// docs/BENCHMARKS.md): for |z| < 1/2 the odd Taylor series to z^17 (the rest
/// under 1e-9 relative), else 1 - 2 / (exp(2|z|) + 1) through fast_exp with z's sign
/// (tests/test_vector_math.cpp checks both against double tanh).
KOKKOS_FORCEINLINE_FUNCTION float fast_tanh(float z) {
  const float a = z < 0.0f ? -z : z, z2 = z * z;
  float p = 6404582.0f / 10854718875.0f;
  p = fmaf(p, z2, -929569.0f / 638512875.0f);
  p = fmaf(p, z2, 21844.0f / 6081075.0f);
  p = fmaf(p, z2, -1382.0f / 155925.0f);
  p = fmaf(p, z2, 62.0f / 2835.0f);
  p = fmaf(p, z2, -17.0f / 315.0f);
  p = fmaf(p, z2, 2.0f / 15.0f);
  p = fmaf(p, z2, -1.0f / 3.0f);
  const float series = fmaf(p * z2, z, z);
  const float e = fast_exp(2.0f * (a < 15.0f ? a : 15.0f));  // (tanh(15) is 1 in float)
  const float far = 1.0f - 2.0f / (e + 1.0f);
  return a < 0.5f ? series : (z < 0.0f ? -far : far);
}

KOKKOS_FORCEINLINE_FUNCTION float activation_value(Activation a, float z) {
  switch (a) {
    case Activation::relu:
      return z > 0.0f ? z : 0.0f;
    case Activation::gelu:
      return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    case Activation::silu:
      return z / (1.0f + fast_exp(-z));
    case Activation::gelu_tanh:  // PyTorch's gelu(approximate="tanh")
      return 0.5f * z * (1.0f + tanh_via_exp(0.79788456080286536f * (z + 0.044715f * z * z * z)));
    default:
      return z;
  }
}

KOKKOS_FORCEINLINE_FUNCTION float activation_derivative(Activation a, float z) {
  switch (a) {
    case Activation::relu:
      return z > 0.0f ? 1.0f : 0.0f;
    case Activation::gelu:
      return 0.5f * (1.0f + erff(z * 0.70710678118654752f)) +
             z * expf(-0.5f * z * z) * 0.39894228040143268f;
    case Activation::silu: {
      const float s = 1.0f / (1.0f + fast_exp(-z));
      return s * (1.0f + z * (1.0f - s));
    }
    case Activation::gelu_tanh: {
      const float u = 0.79788456080286536f * (z + 0.044715f * z * z * z);
      const float t = tanh_via_exp(u);
      return 0.5f * (1.0f + t) +
             0.5f * z * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * z * z);
    }
    default:
      return 1.0f;
  }
}

/// A soft-cap s = c tanh(x / c) as transformers computes it in the activations' dtype
/// (bfloat16: each of its three operations rounded); `tanh_out` receives the tanh.
KOKKOS_INLINE_FUNCTION float soft_cap(float x, float c, bool bf16, float* tanh_out = nullptr) {
  float z = x / c;
  if (bf16) z = round_to_bf16(z);
  float t = tanhf(z);
  if (bf16) t = round_to_bf16(t);
  if (tanh_out) *tanh_out = t;
  const float v = t * c;
  return bf16 ? round_to_bf16(v) : v;
}

template <class ExecSpace>
using Policy2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, Kokkos::Iterate::Right>,
                                      Kokkos::IndexType<int64_t>>;

/// The [rows, cols] range of an elementwise kernel. Hosts: Kokkos's default tiling. GPUs:
/// blocks of 256 threads (Kokkos's default for Rank 2 runs 32-thread blocks, too few to fill
/// a warp scheduler), the contiguous index across whole warps where rows are wide enough.
template <class ExecSpace>
Policy2<ExecSpace> over(const ExecSpace& exec, int64_t rows, int64_t cols) {
  if constexpr (is_host_space<ExecSpace>()) {
    return Policy2<ExecSpace>(exec, {0, 0}, {rows, cols});
  } else {
    int64_t tile_cols = 32;
    while (tile_cols < cols && tile_cols < 256) tile_cols *= 2;
    return Policy2<ExecSpace>(exec, {0, 0}, {rows, cols}, {256 / tile_cols, tile_cols});
  }
}

/// The elements of a [rows, cols] matrix as one flat range (a Matrix is contiguous): the
/// host's loop over it vectorises, where a 2-D range stays scalar (12 ns an element).
template <class ExecSpace, class M>
Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>> flat_range(const ExecSpace& exec,
                                                                      const Matrix<M>& x) {
  KQLORA_CHECK(x.span_is_contiguous(), "flat_range: a matrix with gaps");
  return Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, x.size());
}

/// a = act(z) (round to bfloat16 when `bf16`).
template <class ExecSpace, class M>
void activation_forward(const ExecSpace& exec, Activation act, bool bf16, const Matrix<M>& z,
                        const Matrix<M>& a) {
  Kokkos::parallel_for(
      "kqlora::activation_forward", over(exec, z.extent(0), z.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float v = activation_value(act, z(t, f));
        a(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

/// g *= act'(z) in place.
template <class ExecSpace, class M>
void activation_backward(const ExecSpace& exec, Activation act, bool bf16, const Matrix<M>& z,
                         const Matrix<M>& g) {
  Kokkos::parallel_for(
      "kqlora::activation_backward", over(exec, z.extent(0), z.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float v = g(t, f) * activation_derivative(act, z(t, f));
        g(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

/// Inverted dropout on the adapter path: out = keep ? x / (1 - p) : 0, the mask a pure
/// function of (seed, layer, step, global sample, feature).
struct DropoutKey {
  uint64_t seed, stream;
  int64_t step, global_bs, first_sample, features;
  float p;

  KOKKOS_INLINE_FUNCTION bool keep(int64_t t, int64_t f) const {
    const uint64_t index =
        static_cast<uint64_t>((step * global_bs + first_sample + t) * features + f);
    return random_uniform(seed, stream, index) >= static_cast<double>(p);
  }
};

template <class ExecSpace, class M>
void dropout_apply(const ExecSpace& exec, const DropoutKey& key, bool bf16, const Matrix<M>& x,
                   const Matrix<M>& out, float beta) {
  const float scale = 1.0f / (1.0f - key.p);
  Kokkos::parallel_for(
      "kqlora::dropout", over(exec, x.extent(0), x.extent(1)), KOKKOS_LAMBDA(int64_t t, int64_t f) {
        float v = key.keep(t, f) ? x(t, f) * scale : 0.0f;
        if (bf16) v = round_to_bf16(v);
        out(t, f) = beta == 0.0f ? v : out(t, f) + v;
      });
}

/// y(t, f) += bias(f).
template <class ExecSpace, class M>
void add_bias(const ExecSpace& exec, const Kokkos::View<const float*, M>& bias, bool bf16,
              const Matrix<M>& y) {
  Kokkos::parallel_for(
      "kqlora::add_bias", over(exec, y.extent(0), y.extent(1)),
      KOKKOS_LAMBDA(int64_t t, int64_t f) {
        const float v = y(t, f) + bias(f);
        y(t, f) = bf16 ? round_to_bf16(v) : v;
      });
}

/// gbias(f) += sum_t g(t, f) (one thread per feature: a fixed summation order);
/// `accumulate` false: gbias(f) = that sum.
template <class ExecSpace, class M>
void accumulate_bias_grad(const ExecSpace& exec, const Matrix<M>& g,
                          const Kokkos::View<float*, M>& gbias, bool accumulate = true) {
  const int64_t T = g.extent(0);
  Kokkos::parallel_for(
      "kqlora::bias_grad",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>(exec, 0, g.extent(1)),
      KOKKOS_LAMBDA(int64_t f) {
        float s = 0.0f;
        for (int64_t t = 0; t < T; ++t) s += g(t, f);
        gbias(f) = accumulate ? gbias(f) + s : s;
      });
}

/// z = R(z + R(s * u)) with R the bfloat16 rounding: PyTorch's `out + lora_out * scaling`.
/// `round_first`: z and u are two products' float32 results, rounded here first (one pass
/// for the three roundings: z = R(R(z) + R(s * R(u)))).
template <class ExecSpace, class M>
void add_scaled_bf16(const ExecSpace& exec, float s, const Matrix<M>& u, const Matrix<M>& z,
                     bool round_first = false) {
  KQLORA_CHECK(u.extent(0) == z.extent(0) && u.extent(1) == z.extent(1) && u.span_is_contiguous(),
               "add_scaled_bf16: shapes");
  const float* up = u.data();
  float* zp = z.data();
  if (round_first)
    Kokkos::parallel_for(
        "kqlora::add_scaled_bf16", flat_range(exec, z), KOKKOS_LAMBDA(int64_t i) {
          zp[i] = round_to_bf16(round_to_bf16(zp[i]) + round_to_bf16(s * round_to_bf16(up[i])));
        });
  else
    Kokkos::parallel_for(
        "kqlora::add_scaled_bf16", flat_range(exec, z),
        KOKKOS_LAMBDA(int64_t i) { zp[i] = round_to_bf16(zp[i] + round_to_bf16(s * up[i])); });
}

/// x = R(x + R(u)): a product's float32 result u, rounded, added to x and rounded.
template <class ExecSpace, class M>
void add_rounded_bf16(const ExecSpace& exec, const Matrix<M>& u, const Matrix<M>& x) {
  KQLORA_CHECK(u.extent(0) == x.extent(0) && u.extent(1) == x.extent(1) && u.span_is_contiguous(),
               "add_rounded_bf16: shapes");
  const float* up = u.data();
  float* xp = x.data();
  Kokkos::parallel_for(
      "kqlora::add_rounded_bf16", flat_range(exec, x),
      KOKKOS_LAMBDA(int64_t i) { xp[i] = round_to_bf16(xp[i] + round_to_bf16(up[i])); });
}

/// out = x * s (x and out may be one matrix), rounded to bfloat16 when `bf16`, s unrounded:
/// PyTorch's tensor times a Python float (Granite's multipliers).
template <class ExecSpace, class M>
void scale_values(const ExecSpace& exec, float s, bool bf16, const Matrix<M>& x,
                  const Matrix<M>& out) {
  KQLORA_CHECK(x.extent(0) == out.extent(0) && x.extent(1) == out.extent(1) &&
                   x.span_is_contiguous() && out.span_is_contiguous(),
               "scale_values: shapes");
  const float* xp = x.data();
  float* op = out.data();
  Kokkos::parallel_for(
      "kqlora::scale_values", flat_range(exec, out), KOKKOS_LAMBDA(int64_t i) {
        const float v = xp[i] * s;
        op[i] = bf16 ? round_to_bf16(v) : v;
      });
}

template <class ExecSpace, class M>
void scale_values(const ExecSpace& exec, float s, bool bf16, const Matrix<M>& x) {
  scale_values(exec, s, bf16, x, x);
}

/// x = x * s[0] in place, s a one-value tensor on the device (Gemma 4's layer_scalar: read
/// there, no host sync), rounded to bfloat16 when `bf16`.
template <class ExecSpace, class M>
void scale_by_scalar(const ExecSpace& exec, const Kokkos::View<const float*, M>& s, bool bf16,
                     const Matrix<M>& x) {
  KQLORA_CHECK(x.span_is_contiguous() && s.extent(0) == 1, "scale_by_scalar: shapes");
  float* xp = x.data();
  Kokkos::parallel_for(
      "kqlora::scale_by_scalar", flat_range(exec, x), KOKKOS_LAMBDA(int64_t i) {
        const float v = xp[i] * s(0);
        xp[i] = bf16 ? round_to_bf16(v) : v;
      });
}

/// x = R(x) in place.
template <class ExecSpace, class M>
void round_bf16(const ExecSpace& exec, const Matrix<M>& x) {
  float* p = x.data();
  Kokkos::parallel_for(
      "kqlora::round_bf16", flat_range(exec, x),
      KOKKOS_LAMBDA(int64_t i) { p[i] = round_to_bf16(p[i]); });
}

}  // namespace kqlora
