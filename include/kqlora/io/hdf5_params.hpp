#pragma once
// Parameters in the checkpoint schema (docs/CHECKPOINTS.md): /params/<name> is a float dataset, or
// an NF4 group holding quantized_data, quantized_scalers, quantization_factor and scaler_mean with
// shape, dtype, block_size and scaler_block_size attributes.

#include <Kokkos_Core.hpp>

#include <string>
#include <vector>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/quant/nf4_shard.hpp"
#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {
class StreamingWriteback;
}

namespace kqlora::h5 {

using HostNf4 = Nf4Tensor<Kokkos::HostSpace>;

/// Writes an NF4 tensor as the group `name` under `loc`.
void write_nf4(hid_t loc, const std::string& name, const HostNf4& t,
               StreamingWriteback* writeback = nullptr);
/// True when `name` under `loc` is an NF4 group (as opposed to a float dataset).
bool is_nf4_group(hid_t loc, const std::string& name);
/// Reads and validates an NF4 group; errors name `file` and the object.
HostNf4 read_nf4(hid_t loc, const std::string& name, const std::string& file);

/// An FSDP shard of an NF4 tensor: the group `name` holds the shard's real blocks (its
/// padding is not stored) with the attributes of write_nf4 for the global tensor plus
/// shard_index, num_shards, first_block and global_shape.
void write_nf4_shard(hid_t loc, const std::string& name, const Nf4Shard<Kokkos::HostSpace>& s,
                     StreamingWriteback* writeback = nullptr);

/// True when `name` under `loc` is an NF4 shard group (write_nf4_shard).
bool is_nf4_shard_group(hid_t loc, const std::string& name);
/// Reads a shard group back into a shard of the global layout (padding restored); checks
/// that its first_block and num_blocks are those of shard shard_index of num_shards.
Nf4Shard<Kokkos::HostSpace> read_nf4_shard(hid_t loc, const std::string& name,
                                           const std::string& file);

/// Float datasets: float32, or bfloat16 in the 2-byte type of bfloat16_type().
void write_float(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                 const float* data, StreamingWriteback* writeback = nullptr);
void write_bfloat16(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                    const bfloat16* data, StreamingWriteback* writeback = nullptr);

}  // namespace kqlora::h5
