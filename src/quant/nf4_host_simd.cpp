// The NF4 host SIMD bodies, compiled inside the library only (with -march=native where
// KQLORA_NATIVE): programs that include nf4_kernels.hpp call these functions and compile
// no SIMD body of their own, whatever their flags. Each entry point has two definitions,
// one per build (the SIMD body, or "none here": false), chosen below once.

#include <cstdint>

#include "kqlora/quant/nf4_kernels.hpp"
#include "nf4_host_simd_intrinsics.hpp"

namespace kqlora::impl {

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using Policy = Kokkos::RangePolicy<Host, Kokkos::IndexType<int64_t>>;

#if KQLORA_HAVE_AVX512
/// Host SIMD encoding, one block per work item (block_size a multiple of 16).
template <class T>
struct Nf4EncodeBlocksAvx512 {
  Kokkos::View<const T*, Kokkos::HostSpace> input;
  Kokkos::View<const float*, Kokkos::HostSpace> absmax;
  Kokkos::View<uint8_t*, Kokkos::HostSpace> data;
  int64_t block_size;

  Nf4Codebook codebook = Nf4Codebook::make<T>();

  void operator()(int64_t b) const {
    const float a = absmax(b);
    uint8_t* out = data.data() + b * (block_size / 2);
    if (!(a > 0.0f)) {  // all-zero block: every code is 0.0
      for (int64_t j = 0; j < block_size / 2; ++j) out[j] = nf4_zero_code * 17;
      return;
    }
    nf4_encode_block_avx512<std::is_same<T, bfloat16>::value>(
        input.data() + b * block_size, block_size, a, _mm512_loadu_ps(codebook.v), out);
  }
};

template <class T>
bool encode(const Host& exec, Kokkos::View<const T*, Kokkos::HostSpace> input,
            Kokkos::View<const float*, Kokkos::HostSpace> absmax,
            Kokkos::View<uint8_t*, Kokkos::HostSpace> data, int64_t block_size) {
  if (block_size % 16 != 0) return false;
  Kokkos::parallel_for("kqlora::Nf4::encode", Policy(exec, 0, absmax.extent(0)),
                       Nf4EncodeBlocksAvx512<T>{input, absmax, data, block_size});
  return true;
}
#else
template <class T>
bool encode(const Host&, Kokkos::View<const T*, Kokkos::HostSpace>,
            Kokkos::View<const float*, Kokkos::HostSpace>,
            Kokkos::View<uint8_t*, Kokkos::HostSpace>, int64_t) {
  return false;  // no AVX-512 in this build: the portable encoder
}
#endif

#if KQLORA_HAVE_AVX512 || KQLORA_HAVE_AVX2
/// Host SIMD dequantization: a run of blocks per work item, a 16-entry table per block.
template <class T, class TOut, bool Stream>
struct Nf4DecodeBlocksHostSimd {
  Kokkos::View<const uint8_t*, Kokkos::HostSpace> data;
  Kokkos::View<const int8_t*, Kokkos::HostSpace> scalers;
  Kokkos::View<const float*, Kokkos::HostSpace> factor;
  Kokkos::View<TOut*, Kokkos::HostSpace> out;
  float mean;
  int64_t block_size, scaler_block_size, num_blocks, blocks_per_item, first_block;
  Nf4Codebook codebook = Nf4Codebook::make<T>();

  void operator()(int64_t item) const {
    constexpr bool bf16_out = std::is_same<TOut, bfloat16>::value;
    constexpr bool round_bf16 = std::is_same<T, bfloat16>::value || bf16_out;
    const Nf4SimdCodebook cb = nf4_simd_codebook(codebook.v);
    const int64_t half = block_size / 2;
    const int64_t i_end =
        (item + 1) * blocks_per_item < num_blocks ? (item + 1) * blocks_per_item : num_blocks;
    for (int64_t i = item * blocks_per_item; i < i_end; ++i) {
      const int64_t b = first_block + i;
      const float s = nf4_block_scale<T>(scalers(b), factor(b / scaler_block_size), mean);
      nf4_decode_block_simd<round_bf16, bf16_out, Stream>(cb, s, data.data() + b * half, half,
                                                          out.data() + i * block_size);
    }
    if (Stream) stream_fence();
  }
};

template <class T, class TOut>
bool decode(const Host& exec, const Nf4Tensor<Kokkos::HostSpace>& t, int64_t first_block,
            int64_t nb, Kokkos::View<TOut*, Kokkos::HostSpace> out, Nf4Store store) {
  const Nf4Layout& L = t.layout;
  if (L.block_size % 16 != 0) return false;
  const int64_t out_block_bytes = L.block_size * static_cast<int64_t>(sizeof(TOut));
  const bool aligned =
      reinterpret_cast<uintptr_t>(out.data()) % 64 == 0 && out_block_bytes % 64 == 0;
  const bool big = nb * out_block_bytes > (int64_t(8) << 20);
  const bool stream =
      aligned && (store == Nf4Store::streaming || (store == Nf4Store::automatic && big));
  // ~16 K elements per work item: enough items for threads, few fences.
  const int64_t per_item = L.block_size >= 16384 ? 1 : 16384 / L.block_size;
  const int64_t items = (nb + per_item - 1) / per_item;
  if (stream) {
    Kokkos::parallel_for(
        "kqlora::Nf4::dequantize", Policy(exec, 0, items),
        Nf4DecodeBlocksHostSimd<T, TOut, true>{
            t.quantized_data, t.quantized_scalers, t.quantization_factor, out, t.scaler_mean,
            L.block_size, L.scaler_block_size, nb, per_item, first_block});
  } else {
    Kokkos::parallel_for(
        "kqlora::Nf4::dequantize", Policy(exec, 0, items),
        Nf4DecodeBlocksHostSimd<T, TOut, false>{
            t.quantized_data, t.quantized_scalers, t.quantization_factor, out, t.scaler_mean,
            L.block_size, L.scaler_block_size, nb, per_item, first_block});
  }
  return true;
}
#else
template <class T, class TOut>
bool decode(const Host&, const Nf4Tensor<Kokkos::HostSpace>&, int64_t, int64_t,
            Kokkos::View<TOut*, Kokkos::HostSpace>, Nf4Store) {
  return false;  // no AVX2 in this build: the portable decoder
}
#endif

}  // namespace

template <class T>
bool nf4_encode_host_simd(const Host& exec, Kokkos::View<const T*, Kokkos::HostSpace> input,
                          Kokkos::View<const float*, Kokkos::HostSpace> absmax,
                          Kokkos::View<uint8_t*, Kokkos::HostSpace> data, int64_t block_size) {
  return encode<T>(exec, input, absmax, data, block_size);
}

template <class T, class TOut>
bool nf4_decode_host_simd(const Host& exec, const Nf4Tensor<Kokkos::HostSpace>& t,
                          int64_t first_block, int64_t nb,
                          Kokkos::View<TOut*, Kokkos::HostSpace> out, Nf4Store store) {
  return decode<T, TOut>(exec, t, first_block, nb, out, store);
}

template bool nf4_encode_host_simd<float>(const Host&,
                                          Kokkos::View<const float*, Kokkos::HostSpace>,
                                          Kokkos::View<const float*, Kokkos::HostSpace>,
                                          Kokkos::View<uint8_t*, Kokkos::HostSpace>, int64_t);
template bool nf4_encode_host_simd<bfloat16>(const Host&,
                                             Kokkos::View<const bfloat16*, Kokkos::HostSpace>,
                                             Kokkos::View<const float*, Kokkos::HostSpace>,
                                             Kokkos::View<uint8_t*, Kokkos::HostSpace>, int64_t);
#define KQLORA_DECODE(T, TOut)                                                                  \
  template bool nf4_decode_host_simd<T, TOut>(const Host&, const Nf4Tensor<Kokkos::HostSpace>&, \
                                              int64_t, int64_t,                                 \
                                              Kokkos::View<TOut*, Kokkos::HostSpace>, Nf4Store);
KQLORA_DECODE(float, float)
KQLORA_DECODE(float, bfloat16)
KQLORA_DECODE(bfloat16, float)
KQLORA_DECODE(bfloat16, bfloat16)
#undef KQLORA_DECODE

}  // namespace kqlora::impl
