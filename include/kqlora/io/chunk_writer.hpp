#pragma once
// Whole chunks of a checkpoint dataset written straight into the file (H5Dwrite_chunk) with
// the Fletcher32 checksum HDF5's filter would have appended: no trip through HDF5's chunk
// cache and filter pipeline. Used by the shared layout (each rank its whole chunks) and by
// every single-writer dataset (h5::write_dataset, here too).

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kqlora {
class StreamingWriteback;
}

namespace kqlora::h5 {

using Range = std::pair<int64_t, int64_t>;

/// Writes the chunks of `ds` (a checkpoint dataset of `dims`: chunked by chunk_dims,
/// Fletcher32) that lie whole in elements [lo, hi) of the flattened dataset, from `data`
/// (element lo; `element_size` bytes each, already in the file's representation). The
/// edge chunk counts as whole when hi is the end. Returns the ranges left to write some
/// other way: the partial chunks at the ends, or all of [lo, hi) where chunks are not
/// contiguous ranges or the host is not little-endian. `buf` is scratch; `writeback`, if
/// given, hears of every byte written.
std::vector<Range> write_whole_chunks(hid_t ds, const std::vector<int64_t>& dims,
                                      size_t element_size, int64_t lo, int64_t hi, const void* data,
                                      std::vector<char>& buf,
                                      StreamingWriteback* writeback = nullptr);

/// A chunked dataset with the Fletcher32 checksum filter, written in one call: data
/// already in the file's representation chunk by chunk straight into the file, the rest
/// through HDF5's pipeline. `writeback`, if given, hears of every byte written.
void write_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                   const std::vector<int64_t>& dims, const void* data,
                   StreamingWriteback* writeback = nullptr);

}  // namespace kqlora::h5
