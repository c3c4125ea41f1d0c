#pragma once
// Loops over one row inside a team kernel (a team per row: the softmaxes and the
// cross-entropy). A team of one thread (the host backends) runs plain loops the compiler
// vectorises, a sum or a max in kLanes interleaved partial results folded in a fixed
// order; Kokkos's team ranges step by a run-time stride, which keeps GCC from vectorising
// them (the 135M step's softmax passes ran 3-5x slower so, docs/BENCHMARKS.md). Larger
// teams (GPUs) use the team ranges.
//
// The passes over a contiguous row x[lo, hi) (the softmaxes' and the cross-entropy's) take
// the row's pointer instead of a function: inlined into a large kernel, GCC 12 left the
// function forms of some of them scalar (the attention softmax of the 135M step ran at
// about 5 ns a score so), and a float maximum vectorises only as explicit vectors (the
// scalar form's NaN and signed-zero rules forbid it otherwise).

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kqlora/core/fast_exp.hpp"

namespace kqlora {

constexpr int kRowLanes = 16;  // one AVX-512 register of floats

/// f(j) for j in [lo, hi), by the team.
template <class Team, class F>
KOKKOS_INLINE_FUNCTION void row_for(const Team& team, int64_t lo, int64_t hi, const F& f) {
  if (team.team_size() == 1) {
    for (int64_t j = lo; j < hi; ++j) f(j);
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lo, hi), f);
  }
}

/// The sum of f(j) over j in [lo, hi) (f may also store, e.g. an exponential kept).
/// The one-thread form (a host team of one, and the host's fused attention, whose rows run
/// inside its own work items: nn/attention_host.hpp).
template <class F>
KOKKOS_INLINE_FUNCTION float row_sum_one_thread(int64_t lo, int64_t hi, const F& f) {
  float acc[kRowLanes] = {};
  int64_t j = lo;
  for (; j + kRowLanes <= hi; j += kRowLanes)
    for (int l = 0; l < kRowLanes; ++l) acc[l] += f(j + l);
  for (int l = 0; j + l < hi; ++l) acc[l] += f(j + l);
  for (int w = kRowLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

template <class Team, class F>
KOKKOS_INLINE_FUNCTION float row_sum(const Team& team, int64_t lo, int64_t hi, const F& f) {
  float s = 0.0f;
  if (team.team_size() == 1) {
    s = row_sum_one_thread(lo, hi, f);
  } else {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, lo, hi), [&](int64_t j, float& a) { a += f(j); }, s);
  }
  return s;
}

/// The largest f(j) over j in [lo, hi); -INFINITY for an empty range.
template <class Team, class F>
KOKKOS_INLINE_FUNCTION float row_max(const Team& team, int64_t lo, int64_t hi, const F& f) {
  float m = -INFINITY;
  if (team.team_size() == 1) {
    float acc[kRowLanes];
    for (int l = 0; l < kRowLanes; ++l) acc[l] = -INFINITY;
    int64_t j = lo;
    for (; j + kRowLanes <= hi; j += kRowLanes)
      for (int l = 0; l < kRowLanes; ++l) {
        const float v = f(j + l);
        acc[l] = v > acc[l] ? v : acc[l];
      }
    for (int l = 0; j + l < hi; ++l) {
      const float v = f(j + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
    for (int l = 0; l < kRowLanes; ++l) m = acc[l] > m ? acc[l] : m;
  } else {
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, lo, hi),
        [&](int64_t j, float& a) {
          const float v = f(j);
          a = v > a ? v : a;
        },
        Kokkos::Max<float>(m));
  }
  return m;
}

// Host vectors of kRowLanes floats (GCC and Clang vector extensions; lowered to what the
// target has).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KQLORA_ROW_VECTORS 1
typedef float RowLanes __attribute__((vector_size(4 * kRowLanes)));
#endif

/// The largest x[j] over j in [lo, hi); -INFINITY for an empty range. One thread.
KOKKOS_INLINE_FUNCTION float row_max_one_thread(const float* x, int64_t lo, int64_t hi) {
  float m = -INFINITY;
  int64_t j = lo;
#ifdef KQLORA_ROW_VECTORS
  RowLanes acc;
  for (int l = 0; l < kRowLanes; ++l) acc[l] = -INFINITY;
  for (; j + kRowLanes <= hi; j += kRowLanes) {
    RowLanes v;
    __builtin_memcpy(&v, x + j, sizeof v);
    acc = v > acc ? v : acc;
  }
  for (int l = 0; l < kRowLanes; ++l) m = acc[l] > m ? acc[l] : m;
#endif
  for (; j < hi; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

/// The largest x[j] over j in [lo, hi); -INFINITY for an empty range.
template <class Team>
KOKKOS_INLINE_FUNCTION float row_max(const Team& team, const float* x, int64_t lo, int64_t hi) {
  if (team.team_size() != 1) return row_max(team, lo, hi, [&](int64_t j) { return x[j]; });
  return row_max_one_thread(x, lo, hi);
}

/// The sum of x[j] over j in [lo, hi), in kRowLanes partial sums on the host.
template <class Team>
KOKKOS_INLINE_FUNCTION float row_sum(const Team& team, const float* x, int64_t lo, int64_t hi) {
  return row_sum(team, lo, hi, [&](int64_t j) { return x[j]; });
}

/// x[j] = exp(x[j] - shift) for j in [lo, hi) (core/fast_exp.hpp). One thread.
KOKKOS_INLINE_FUNCTION void row_exp_one_thread(float* x, int64_t lo, int64_t hi, float shift) {
  int64_t j = lo;
  for (; j + kRowLanes <= hi; j += kRowLanes)
    for (int l = 0; l < kRowLanes; ++l) x[j + l] = fast_exp(x[j + l] - shift);
  if (j == hi) return;
  // The tail as one full vector through a copy: left to the compiler, its up to 15
  // exponentials ran scalar, about as long as the rest of an attention row (rows of the
  // causal blocks are rarely a multiple of 16 long).
  const int n = static_cast<int>(hi - j);
  float t[kRowLanes];
  for (int l = 0; l < kRowLanes; ++l) t[l] = l < n ? x[j + l] : shift;
  for (int l = 0; l < kRowLanes; ++l) t[l] = fast_exp(t[l] - shift);
  for (int l = 0; l < n; ++l) x[j + l] = t[l];
}

/// x[j] = exp(x[j] - shift) for j in [lo, hi) (core/fast_exp.hpp).
template <class Team>
KOKKOS_INLINE_FUNCTION void row_exp(const Team& team, float* x, int64_t lo, int64_t hi,
                                    float shift) {
  if (team.team_size() != 1)
    return row_for(team, lo, hi, [&](int64_t j) { x[j] = fast_exp(x[j] - shift); });
  row_exp_one_thread(x, lo, hi, shift);
}

/// x[j] *= s for j in [lo, hi).
template <class Team>
KOKKOS_INLINE_FUNCTION void row_scale(const Team& team, float* x, int64_t lo, int64_t hi, float s) {
  if (team.team_size() != 1) return row_for(team, lo, hi, [&](int64_t j) { x[j] *= s; });
  for (int64_t j = lo; j < hi; ++j) x[j] *= s;
}

/// x[j] = v for j in [lo, hi).
template <class Team>
KOKKOS_INLINE_FUNCTION void row_fill(const Team& team, float* x, int64_t lo, int64_t hi, float v) {
  if (team.team_size() != 1) return row_for(team, lo, hi, [&](int64_t j) { x[j] = v; });
  for (int64_t j = lo; j < hi; ++j) x[j] = v;
}

}  // namespace kqlora
