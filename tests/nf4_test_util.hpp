#pragma once
// Helpers shared by the NF4 tests: host vectors <-> Kokkos views, quantize/dequantize on
// the default execution space.

#include <Kokkos_Core.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kqlora/quant/nf4_kernels.hpp"

namespace nf4test {

/// The bits of a float (values of bfloat16 widen exactly, so this compares them too).
inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline std::vector<float> randn(int64_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * d(gen);
  return v;
}

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using HostNf4 = kqlora::Nf4Tensor<Kokkos::HostSpace>;

template <class T, class M = Mem>
Kokkos::View<T*, M> to_device(const std::vector<T>& v) {
  Kokkos::View<T*, M> d("nf4test::input", v.size());
  Kokkos::deep_copy(
      d, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(v.data(), v.size()));
  return d;
}

template <class T, class M>
std::vector<T> to_host(Kokkos::View<T*, M> d) {
  std::vector<T> v(d.extent(0));
  Kokkos::deep_copy(
      Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(v.data(), v.size()), d);
  return v;
}

/// On execution space E (by default the default one).
template <class T, class E = Exec>
HostNf4 quantize(const std::vector<T>& x, kqlora::Nf4Layout layout) {
  using M = typename E::memory_space;
  auto d = to_device<T, M>(x);
  auto t = kqlora::nf4_quantize<T>(E(), Kokkos::View<const T*, M>(d), layout);
  return kqlora::nf4_copy_to<Kokkos::HostSpace>(t);
}

template <class TOut, class E = Exec>
std::vector<TOut> dequantize(const HostNf4& t,
                             kqlora::Nf4Store store = kqlora::Nf4Store::automatic) {
  using M = typename E::memory_space;
  auto dt = kqlora::nf4_copy_to<M>(t);
  Kokkos::View<TOut*, M> out("nf4test::out", t.layout.numel());
  kqlora::nf4_dequantize(E(), dt, out, store);
  return to_host(out);
}

/// The portable (non-SIMD) dequantization body run on the host, to check it against the
/// SIMD one on machines that have AVX-512.
template <class T, class TOut>
std::vector<TOut> dequantize_portable(const HostNf4& t) {
  Kokkos::View<TOut*, Kokkos::HostSpace> out("nf4test::out", t.layout.numel());
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<int64_t>>(
          0, t.layout.num_blocks()),
      kqlora::impl::Nf4DecodeBlocks<T, TOut, Kokkos::HostSpace>{
          t.quantized_data, t.quantized_scalers, t.quantization_factor, out, t.scaler_mean,
          t.layout.block_size, t.layout.scaler_block_size});
  Kokkos::fence();
  return std::vector<TOut>(out.data(), out.data() + out.extent(0));
}

/// The device dequantization body (a byte per work item) run on the host, blocks
/// [first, first + n).
template <class T, class TOut>
std::vector<TOut> dequantize_bytes(const HostNf4& t, int64_t first = 0, int64_t n = -1) {
  if (n < 0) n = t.layout.num_blocks() - first;
  const int64_t bs = t.layout.block_size;
  Kokkos::View<TOut*, Kokkos::HostSpace> out("nf4test::out", n * bs);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<int64_t>>(
          0, n * bs / 2),
      kqlora::impl::Nf4DecodeBytes<T, TOut, Kokkos::HostSpace>{
          t.quantized_data, t.quantized_scalers, t.quantization_factor, out, t.scaler_mean, bs,
          t.layout.scaler_block_size, first});
  Kokkos::fence();
  return std::vector<TOut>(out.data(), out.data() + out.extent(0));
}

}  // namespace nf4test
