#pragma once
// HDF5's Fletcher32 checksum (the H5Z_FILTER_FLETCHER32 filter: big-endian 16-bit words,
// sums folded every 360 words), computed here so that chunks written directly
// (H5Dwrite_chunk) carry the checksum HDF5 verifies on reading.

#include <cstddef>
#include <cstdint>

namespace kqlora::h5 {

uint32_t fletcher32(const void* data, size_t bytes);

}  // namespace kqlora::h5
