#pragma once
// NF4 quantize and dequantize as Kokkos kernels, templated on the execution space.
// Reductions use a fixed order (per scaler block, then over scaler blocks in index order,
// in double), so every backend and thread count gives the same bytes.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/quant/nf4_codebook.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

/// How dequantize writes its output: streaming (non-temporal) stores suit outputs larger
/// than the caches that are not read again soon; `automatic` streams above 8 MiB.
enum class Nf4Store { automatic, cached, streaming };

/// Which algorithm a kernel uses on an execution space: on the default host space, the
/// library's host SIMD bodies (the AVX-512 block encoder, the AVX-512 or AVX2 block
/// decoder, compiled inside the library for the CPU it was built for: a program that
/// includes this header compiles none of them, whatever its flags); the portable bodies
/// below elsewhere (CUDA) and wherever the library has no SIMD body for the case.
template <class ExecSpace>
struct Nf4HostSimd {
  static constexpr bool value = std::is_same<ExecSpace, Kokkos::DefaultHostExecutionSpace>::value;
};

namespace impl {
/// The host SIMD bodies (src/quant/nf4_host_simd.cpp): true when they did the work, false
/// where this build or the layout has none (block_size not a multiple of 16, no AVX2).
template <class T>
bool nf4_encode_host_simd(const Kokkos::DefaultHostExecutionSpace& exec,
                          Kokkos::View<const T*, Kokkos::HostSpace> input,
                          Kokkos::View<const float*, Kokkos::HostSpace> absmax,
                          Kokkos::View<uint8_t*, Kokkos::HostSpace> data, int64_t block_size);
template <class T, class TOut>
bool nf4_decode_host_simd(const Kokkos::DefaultHostExecutionSpace& exec,
                          const Nf4Tensor<Kokkos::HostSpace>& t, int64_t first_block, int64_t nb,
                          Kokkos::View<TOut*, Kokkos::HostSpace> out, Nf4Store store);
}  // namespace impl

namespace impl {

template <class T, class MemSpace>
struct Nf4BlockAbsmax {
  Kokkos::View<const T*, MemSpace> input;
  Kokkos::View<float*, MemSpace> absmax;
  int64_t block_size;

  KOKKOS_INLINE_FUNCTION void operator()(int64_t b) const {
    // The max of |x| as the max of the sign-cleared bit patterns: the same order for
    // non-negative floats, an integer reduction that vectorises, and Inf/NaN land at or
    // above the infinity pattern.
    uint32_t m = 0;
    const int64_t base = b * block_size;
    for (int64_t i = 0; i < block_size; ++i) {
      const uint32_t u = bit_cast<uint32_t>(Rounding<T>::load(input(base + i))) & 0x7fffffffu;
      m = u > m ? u : m;
    }
    absmax(b) = m < 0x7f800000u ? bit_cast<float>(m) : NAN;  // caller sees NaN in the sums
  }
};

/// One past the last block of scaler block g (the last scaler block may be partial).
KOKKOS_INLINE_FUNCTION int64_t scaler_block_end(int64_t g, int64_t scaler_block_size,
                                                int64_t num_blocks) {
  const int64_t end = (g + 1) * scaler_block_size;
  return end < num_blocks ? end : num_blocks;
}

/// Sum of each scaler block's absmaxes, in index order, in double.
template <class MemSpace>
struct Nf4ScalerPartialSums {
  Kokkos::View<const float*, MemSpace> absmax;
  Kokkos::View<double*, MemSpace> partial;
  int64_t scaler_block_size, num_blocks;

  KOKKOS_INLINE_FUNCTION void operator()(int64_t g) const {
    const int64_t begin = g * scaler_block_size;
    const int64_t end = scaler_block_end(g, scaler_block_size, num_blocks);
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) s += absmax(i);
    partial(g) = s;
  }
};

template <class T, class MemSpace>
struct Nf4DoubleQuantize {
  using R = Rounding<T>;
  Kokkos::View<const float*, MemSpace> absmax;
  Kokkos::View<int8_t*, MemSpace> scalers;
  Kokkos::View<float*, MemSpace> factor;
  float mean;
  int64_t scaler_block_size, num_blocks;

  KOKKOS_INLINE_FUNCTION void operator()(int64_t g) const {
    const int64_t begin = g * scaler_block_size;
    const int64_t end = scaler_block_end(g, scaler_block_size, num_blocks);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = fmaxf(amax, fabsf(R::round(absmax(i) - mean)));
    // torchao: 256 / (2 * absmax), which PyTorch evaluates as reciprocal(2 * absmax) * 256.
    // Constant scalers (absmax 0) get factor 1 instead of torchao's infinity.
    const float f = amax > 0.0f ? R::round(R::round(1.0f / R::round(2.0f * amax)) * 256.0f) : 1.0f;
    factor(g) = f;
    for (int64_t i = begin; i < end; ++i) {
      const float q = nearbyintf(R::round(R::round(absmax(i) - mean) * f));  // half to even
      scalers(i) = static_cast<int8_t>(q < -128.0f ? -128.0f : (q > 127.0f ? 127.0f : q));
    }
  }
};

template <class T, class MemSpace>
struct Nf4EncodeBlocks {
  using R = Rounding<T>;
  Kokkos::View<const T*, MemSpace> input;
  Kokkos::View<const float*, MemSpace> absmax;
  Kokkos::View<uint8_t*, MemSpace> data;
  int64_t block_size;
  Nf4Codebook cb = Nf4Codebook::make<T>();

  KOKKOS_INLINE_FUNCTION void operator()(int64_t b) const {
    const float a = absmax(b);
    const int64_t half = block_size / 2;
    const int64_t in0 = b * block_size, out0 = b * half;
    for (int64_t j = 0; j < half; ++j) {
      const int hi = nf4_nearest_code<T>(R::round(R::load(input(in0 + 2 * j)) / a), cb);
      const int lo = nf4_nearest_code<T>(R::round(R::load(input(in0 + 2 * j + 1)) / a), cb);
      data(out0 + j) = static_cast<uint8_t>((hi << 4) | lo);
    }
  }
};

/// Output conversion: float32 or bfloat16 from a float holding a value of the NF4 dtype.
KOKKOS_INLINE_FUNCTION void nf4_store(float* p, float v) {
  *p = v;
}
KOKKOS_INLINE_FUNCTION void nf4_store(bfloat16* p, float v) {
  *p = bfloat16(v);
}

/// Portable dequantization: one block per work item; block first_block + i of the tensor
/// goes to out[i * block_size ...].
template <class T, class TOut, class MemSpace>
struct Nf4DecodeBlocks {
  Kokkos::View<const uint8_t*, MemSpace> data;
  Kokkos::View<const int8_t*, MemSpace> scalers;
  Kokkos::View<const float*, MemSpace> factor;
  Kokkos::View<TOut*, MemSpace> out;
  float mean;
  int64_t block_size, scaler_block_size, first_block = 0;
  Nf4Codebook cb = Nf4Codebook::make<T>();

  KOKKOS_INLINE_FUNCTION void operator()(int64_t i) const {
    const int64_t b = first_block + i;
    const float s = nf4_block_scale<T>(scalers(b), factor(b / scaler_block_size), mean);
    TOut table[16];  // this block's 16 output values
    for (int k = 0; k < 16; ++k) nf4_store(&table[k], nf4_decode<T>(cb.v[k], s));
    const int64_t half = block_size / 2;
    for (int64_t j = 0; j < half; ++j) {
      const uint8_t byte = data(b * half + j);
      out(i * block_size + 2 * j) = table[byte >> 4];
      out(i * block_size + 2 * j + 1) = table[byte & 15];
    }
  }
};

/// Device dequantization: one byte (two values) per work item, so that a warp reads 32
/// consecutive bytes and writes 64 consecutive values (one block per thread strided its
/// stores by block_size); the block's scale is recomputed by every item, as its inputs are
/// read by the whole warp at once. The arithmetic is Nf4DecodeBlocks's, value for value.
/// Item k of the range writes out[2k], out[2k + 1].
template <class T, class TOut, class MemSpace>
struct Nf4DecodeBytes {
  Kokkos::View<const uint8_t*, MemSpace> data;
  Kokkos::View<const int8_t*, MemSpace> scalers;
  Kokkos::View<const float*, MemSpace> factor;
  Kokkos::View<TOut*, MemSpace> out;
  float mean;
  int64_t block_size, scaler_block_size, first_block = 0;
  Nf4Codebook cb = Nf4Codebook::make<T>();

  KOKKOS_INLINE_FUNCTION void operator()(int64_t k) const {
    const int64_t half = block_size / 2;
    const int64_t b = first_block + k / half;
    const float s = nf4_block_scale<T>(scalers(b), factor(b / scaler_block_size), mean);
    const uint8_t byte = data(first_block * half + k);
    nf4_store(&out(2 * k), nf4_decode<T>(cb.v[byte >> 4], s));
    nf4_store(&out(2 * k + 1), nf4_decode<T>(cb.v[byte & 15], s));
  }
};

template <class T, class TOut, class ExecSpace, class MemSpace>
void nf4_dequantize_as(const ExecSpace& exec, const Nf4Tensor<MemSpace>& t, int64_t first_block,
                       int64_t nb, Kokkos::View<TOut*, MemSpace> out, Nf4Store store) {
  const Nf4Layout& L = t.layout;
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>;
  if constexpr (Nf4HostSimd<ExecSpace>::value && std::is_same<MemSpace, Kokkos::HostSpace>::value) {
    if (nf4_decode_host_simd<T, TOut>(exec, t, first_block, nb, out, store)) return;
  }
  (void)store;
  if constexpr (!is_host_space<ExecSpace>()) {  // GPUs: coalesced, a byte an item
    Kokkos::parallel_for("kqlora::Nf4::dequantize_bytes", Policy(exec, 0, nb * L.block_size / 2),
                         Nf4DecodeBytes<T, TOut, MemSpace>{
                             t.quantized_data, t.quantized_scalers, t.quantization_factor, out,
                             t.scaler_mean, L.block_size, L.scaler_block_size, first_block});
    return;
  }
  Kokkos::parallel_for("kqlora::Nf4::dequantize", Policy(exec, 0, nb),
                       Nf4DecodeBlocks<T, TOut, MemSpace>{
                           t.quantized_data, t.quantized_scalers, t.quantization_factor, out,
                           t.scaler_mean, L.block_size, L.scaler_block_size, first_block});
}

}  // namespace impl

/// Quantizes a contiguous float32 or bfloat16 tensor of `layout.shape` to NF4.
/// Throws InputError when the layout breaks a size rule or the input has NaN or Inf.
template <class T, class ExecSpace, class MemSpace>
Nf4Tensor<MemSpace> nf4_quantize(const ExecSpace& exec, Kokkos::View<const T*, MemSpace> input,
                                 Nf4Layout layout, const std::string& name = "tensor") {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "input memory not accessible from exec");
  static_assert(std::is_same<T, float>::value || std::is_same<T, bfloat16>::value,
                "NF4 quantizes float32 or bfloat16");
  layout.dtype = Rounding<T>::dtype;
  layout.validate(name);
  KQLORA_INPUT_CHECK(
      static_cast<int64_t>(input.extent(0)) == layout.numel(),
      name << ": " << input.extent(0) << " elements for shape " << layout.shape_string());
  const int64_t nb = layout.num_blocks(), nsb = layout.num_scaler_blocks();
  auto t = Nf4Tensor<MemSpace>::allocate(layout);
  Kokkos::View<float*, MemSpace> absmax(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Nf4::absmax"), nb);
  Kokkos::View<double*, MemSpace> partial(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Nf4::absmax_sums"), nsb);
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int64_t>>;

  Kokkos::parallel_for("kqlora::Nf4::block_absmax", Policy(exec, 0, nb),
                       impl::Nf4BlockAbsmax<T, MemSpace>{input, absmax, layout.block_size});
  Kokkos::parallel_for(
      "kqlora::Nf4::absmax_sums", Policy(exec, 0, nsb),
      impl::Nf4ScalerPartialSums<MemSpace>{absmax, partial, layout.scaler_block_size, nb});
  auto partial_host = Kokkos::create_mirror_view(partial);
  Kokkos::deep_copy(exec, partial_host, partial);
  fence(exec, "kqlora::Nf4::quantize::absmax_sums");
  double sum = 0.0;
  for (int64_t g = 0; g < nsb; ++g) sum += partial_host(g);
  KQLORA_INPUT_CHECK(std::isfinite(sum), name << ": cannot quantize to NF4: the tensor holds NaN "
                                                 "or Inf (or overflows float32)");
  // The mean is rounded once to the dtype (docs/NF4.md: the one exception to per-op rounding).
  const double mean = sum / static_cast<double>(nb);
  t.scaler_mean = std::is_same<T, float>::value ? static_cast<float>(mean)
                                                : static_cast<float>(bf16_from_double(mean));

  Kokkos::parallel_for(
      "kqlora::Nf4::double_quantize", Policy(exec, 0, nsb),
      impl::Nf4DoubleQuantize<T, MemSpace>{absmax, t.quantized_scalers, t.quantization_factor,
                                           t.scaler_mean, layout.scaler_block_size, nb});
  bool encoded = false;
  if constexpr (Nf4HostSimd<ExecSpace>::value && std::is_same<MemSpace, Kokkos::HostSpace>::value)
    encoded =
        impl::nf4_encode_host_simd<T>(exec, input, absmax, t.quantized_data, layout.block_size);
  if (!encoded) {
    Kokkos::parallel_for(
        "kqlora::Nf4::encode", Policy(exec, 0, nb),
        impl::Nf4EncodeBlocks<T, MemSpace>{input, absmax, t.quantized_data, layout.block_size});
  }
  fence(exec, "kqlora::Nf4::quantize");
  return t;
}

/// Dequantizes blocks [first_block, first_block + num_blocks) into `out` (float32 or
/// bfloat16, num_blocks * block_size elements) with torchao's arithmetic in the NF4 dtype;
/// a float32 NF4 dequantized to bfloat16 is rounded once at the end. Row panels of a 2-D
/// weight are block ranges when the panel's size is a multiple of block_size.
template <class TOut, class ExecSpace, class MemSpace>
void nf4_dequantize_blocks(const ExecSpace& exec, const Nf4Tensor<MemSpace>& t, int64_t first_block,
                           int64_t num_blocks, Kokkos::View<TOut*, MemSpace> out,
                           Nf4Store store = Nf4Store::automatic) {
  static_assert(accessible_from<ExecSpace, MemSpace>(), "NF4 memory not accessible from exec");
  static_assert(std::is_same<TOut, float>::value || std::is_same<TOut, bfloat16>::value,
                "NF4 dequantizes to float32 or bfloat16");
  const Nf4Layout& L = t.layout;
  KQLORA_CHECK(!(first_block < 0 || num_blocks < 0 || first_block + num_blocks > L.num_blocks()),
               "nf4_dequantize: blocks [" << first_block << ", " << first_block + num_blocks
                                          << ") outside the tensor's " << L.num_blocks());
  KQLORA_CHECK(!(static_cast<int64_t>(out.extent(0)) < num_blocks * L.block_size),
               "nf4_dequantize: output has " << out.extent(0) << " elements, "
                                             << num_blocks * L.block_size << " needed");
  if (L.dtype == DType::float32) {
    impl::nf4_dequantize_as<float>(exec, t, first_block, num_blocks, out, store);
  } else {
    impl::nf4_dequantize_as<bfloat16>(exec, t, first_block, num_blocks, out, store);
  }
}

/// Dequantizes the whole tensor into `out` (numel elements).
template <class TOut, class ExecSpace, class MemSpace>
void nf4_dequantize(const ExecSpace& exec, const Nf4Tensor<MemSpace>& t,
                    Kokkos::View<TOut*, MemSpace> out, Nf4Store store = Nf4Store::automatic) {
  KQLORA_CHECK(
      static_cast<int64_t>(out.extent(0)) == t.layout.numel(),
      "nf4_dequantize: output has " << out.extent(0) << " elements, tensor " << t.layout.numel());
  nf4_dequantize_blocks(exec, t, 0, t.layout.num_blocks(), out, store);
}

}  // namespace kqlora
