#pragma once
// FSDP sharding of NF4 tensors in the quantized domain (docs/NF4.md, "Sharding (FSDP)"): shard r of
// N holds the whole scaler blocks [r*k, min((r+1)*k, n_sb)) with k = ceil(n_sb / N); every
// shard has room for k scaler blocks, and what lies past the tensor is padding (codes 0x77,
// q = 0, factor 1) that gathering drops. Equal-sized shards make the all-gather a plain
// fixed-size collective.

#include <Kokkos_Core.hpp>

#include <vector>

#include "kqlora/core/error.hpp"
#include "kqlora/core/kokkos_compat.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

struct Nf4ShardRange {
  int64_t first_scaler_block = 0;
  int64_t num_scaler_blocks = 0;  // real scaler blocks in this shard (0 for an all-padding one)
  int64_t capacity_scaler_blocks = 0;
  int64_t first_block = 0;
  int64_t num_blocks = 0;  // real blocks (the tensor's last scaler block may be partial)
  int64_t capacity_blocks = 0;
};

Nf4ShardRange nf4_shard_range(const Nf4Layout& layout, int index, int count);

template <class MemorySpace>
struct Nf4Shard {
  Nf4Layout global;
  int shard_index = 0, num_shards = 1;
  Nf4ShardRange range;
  Kokkos::View<uint8_t*, MemorySpace> quantized_data;     // capacity_blocks * block_size / 2
  Kokkos::View<int8_t*, MemorySpace> quantized_scalers;   // capacity_blocks
  Kokkos::View<float*, MemorySpace> quantization_factor;  // capacity_scaler_blocks
  float scaler_mean = 0.0f;                               // global, the same on every shard

  static Nf4Shard allocate(const Nf4Layout& global, int index, int count) {
    Nf4Shard s;
    s.global = global;
    s.shard_index = index;
    s.num_shards = count;
    s.range = nf4_shard_range(global, index, count);
    s.quantized_data = Kokkos::View<uint8_t*, MemorySpace>(
        "kqlora::Nf4Shard::quantized_data", s.range.capacity_blocks * global.block_size / 2);
    s.quantized_scalers = Kokkos::View<int8_t*, MemorySpace>("kqlora::Nf4Shard::quantized_scalers",
                                                             s.range.capacity_blocks);
    s.quantization_factor = Kokkos::View<float*, MemorySpace>(
        "kqlora::Nf4Shard::quantization_factor", s.range.capacity_scaler_blocks);
    return s;
  }
};

/// A copy of a shard in host memory (for I/O).
template <class SrcSpace>
Nf4Shard<Kokkos::HostSpace> nf4_shard_host(const Nf4Shard<SrcSpace>& s) {
  auto h = Nf4Shard<Kokkos::HostSpace>::allocate(s.global, s.shard_index, s.num_shards);
  Kokkos::deep_copy(h.quantized_data, s.quantized_data);            // device-wide: checkpoint I/O
  Kokkos::deep_copy(h.quantized_scalers, s.quantized_scalers);      // device-wide: checkpoint I/O
  Kokkos::deep_copy(h.quantization_factor, s.quantization_factor);  // device-wide: checkpoint I/O
  h.scaler_mean = s.scaler_mean;
  return h;
}

/// Shard `index` of `count` of a global tensor.
template <class ExecSpace, class MemSpace>
Nf4Shard<MemSpace> nf4_shard(const ExecSpace& exec, const Nf4Tensor<MemSpace>& t, int index,
                             int count) {
  auto s = Nf4Shard<MemSpace>::allocate(t.layout, index, count);
  const Nf4ShardRange& r = s.range;
  const int64_t half = t.layout.block_size / 2;
  using Kokkos::make_pair;
  using Kokkos::subview;
  // Padding first, then the real part over it.
  Kokkos::deep_copy(exec, s.quantized_data, uint8_t(0x77));
  Kokkos::deep_copy(exec, s.quantized_scalers, int8_t(0));
  Kokkos::deep_copy(exec, s.quantization_factor, 1.0f);
  if (r.num_blocks > 0) {
    Kokkos::deep_copy(exec, subview(s.quantized_data, make_pair(int64_t(0), r.num_blocks * half)),
                      subview(t.quantized_data, make_pair(r.first_block * half,
                                                          (r.first_block + r.num_blocks) * half)));
    Kokkos::deep_copy(
        exec, subview(s.quantized_scalers, make_pair(int64_t(0), r.num_blocks)),
        subview(t.quantized_scalers, make_pair(r.first_block, r.first_block + r.num_blocks)));
    Kokkos::deep_copy(
        exec, subview(s.quantization_factor, make_pair(int64_t(0), r.num_scaler_blocks)),
        subview(t.quantization_factor,
                make_pair(r.first_scaler_block, r.first_scaler_block + r.num_scaler_blocks)));
  }
  s.scaler_mean = t.scaler_mean;
  fence(exec, "kqlora::Nf4::shard");
  return s;
}

/// Rebuilds the global tensor from its shards (any order of the vector is accepted; every
/// index 0..N-1 must be there once, all cut from the same tensor).
template <class ExecSpace, class MemSpace>
Nf4Tensor<MemSpace> nf4_gather(const ExecSpace& exec,
                               const std::vector<Nf4Shard<MemSpace>>& shards) {
  KQLORA_CHECK(!shards.empty(), "nf4_gather: no shards");
  const Nf4Layout& L = shards[0].global;
  const int n = shards[0].num_shards;
  KQLORA_CHECK(static_cast<int>(shards.size()) == n,
               "nf4_gather: " << shards.size() << " shards given, " << n << " expected");
  std::vector<int> seen(n, 0);
  auto t = Nf4Tensor<MemSpace>::allocate(L);
  t.scaler_mean = shards[0].scaler_mean;
  const int64_t half = L.block_size / 2;
  using Kokkos::make_pair;
  using Kokkos::subview;
  for (const auto& s : shards) {
    KQLORA_CHECK(!(s.global != L || s.num_shards != n || s.shard_index < 0 || s.shard_index >= n ||
                   seen[s.shard_index]++ || s.scaler_mean != t.scaler_mean),
                 "nf4_gather: shard " << s.shard_index << " of " << s.num_shards
                                      << " does not belong to this set");
    const Nf4ShardRange& r = s.range;
    if (r.num_blocks == 0) continue;
    Kokkos::deep_copy(exec,
                      subview(t.quantized_data, make_pair(r.first_block * half,
                                                          (r.first_block + r.num_blocks) * half)),
                      subview(s.quantized_data, make_pair(int64_t(0), r.num_blocks * half)));
    Kokkos::deep_copy(
        exec, subview(t.quantized_scalers, make_pair(r.first_block, r.first_block + r.num_blocks)),
        subview(s.quantized_scalers, make_pair(int64_t(0), r.num_blocks)));
    Kokkos::deep_copy(
        exec,
        subview(t.quantization_factor,
                make_pair(r.first_scaler_block, r.first_scaler_block + r.num_scaler_blocks)),
        subview(s.quantization_factor, make_pair(int64_t(0), r.num_scaler_blocks)));
  }
  fence(exec, "kqlora::Nf4::gather");
  return t;
}

}  // namespace kqlora
