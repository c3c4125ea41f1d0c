#pragma once
// The NF4 tensor: 4-bit NormalFloat codes with double-quantized block scalers, laid out
// as torchao's NF4Tensor (docs/NF4.md).

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "kqlora/quant/nf4_layout.hpp"

namespace kqlora {

template <class MemorySpace>
struct Nf4Tensor {
  using memory_space = MemorySpace;

  Nf4Layout layout;
  /// numel/2 bytes, two codes per byte, the even element in the high nibble.
  Kokkos::View<uint8_t*, MemorySpace> quantized_data;
  /// One int8 per block of block_size elements.
  Kokkos::View<int8_t*, MemorySpace> quantized_scalers;
  /// One per scaler block; values of layout.dtype held as float (bfloat16 widens exactly).
  Kokkos::View<float*, MemorySpace> quantization_factor;
  /// Mean of the block absmaxes, a value of layout.dtype held as float.
  float scaler_mean = 0.0f;

  /// Allocates the components for `layout` (contents uninitialised).
  static Nf4Tensor allocate(const Nf4Layout& layout) {
    Nf4Tensor t;
    t.layout = layout;
    t.quantized_data = Kokkos::View<uint8_t*, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Nf4::quantized_data"),
        layout.num_bytes());
    t.quantized_scalers = Kokkos::View<int8_t*, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Nf4::quantized_scalers"),
        layout.num_blocks());
    t.quantization_factor = Kokkos::View<float*, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kqlora::Nf4::quantization_factor"),
        layout.num_scaler_blocks());
    return t;
  }

  /// Bytes held by the four components.
  int64_t storage_bytes() const {
    return layout.num_bytes() + layout.num_blocks() + 4 * layout.num_scaler_blocks() + 4;
  }
};

/// A deep copy of `src` into DstSpace, ordered on `exec` (no device-wide sync; the caller
/// fences `exec` before the host reads the copy or frees or rewrites the source).
template <class DstSpace, class ExecSpace, class SrcSpace>
Nf4Tensor<DstSpace> nf4_copy_to(const ExecSpace& exec, const Nf4Tensor<SrcSpace>& src) {
  auto dst = Nf4Tensor<DstSpace>::allocate(src.layout);
  Kokkos::deep_copy(exec, dst.quantized_data, src.quantized_data);
  Kokkos::deep_copy(exec, dst.quantized_scalers, src.quantized_scalers);
  Kokkos::deep_copy(exec, dst.quantization_factor, src.quantization_factor);
  dst.scaler_mean = src.scaler_mean;
  return dst;
}

/// A deep copy of `src` into DstSpace (e.g. to the host for I/O), complete on return:
/// device-wide, so only outside the training step (set-up, checkpoints, export).
template <class DstSpace, class SrcSpace>
Nf4Tensor<DstSpace> nf4_copy_to(const Nf4Tensor<SrcSpace>& src) {
  auto dst = Nf4Tensor<DstSpace>::allocate(src.layout);
  // device-wide: outside the step (set-up, checkpoints, export, end of run)
  Kokkos::deep_copy(dst.quantized_data, src.quantized_data);
  // device-wide: as above
  Kokkos::deep_copy(dst.quantized_scalers, src.quantized_scalers);
  // device-wide: as above
  Kokkos::deep_copy(dst.quantization_factor, src.quantization_factor);
  dst.scaler_mean = src.scaler_mean;
  return dst;
}

/// The tensor in host memory: shared when it is there already, else a copy.
template <class SrcSpace>
Nf4Tensor<Kokkos::HostSpace> nf4_host(const Nf4Tensor<SrcSpace>& src) {
  if constexpr (std::is_same<SrcSpace, Kokkos::HostSpace>::value) {
    return src;
  } else {
    return nf4_copy_to<Kokkos::HostSpace>(src);
  }
}

}  // namespace kqlora
