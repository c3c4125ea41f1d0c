#include "kqlora/io/chunk_writer.hpp"

#include <algorithm>
#include <cstring>

#include "kqlora/io/fletcher32.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/streaming_writeback.hpp"

namespace kqlora::h5 {

std::vector<Range> write_whole_chunks(hid_t ds, const std::vector<int64_t>& dims,
                                      size_t element_size, int64_t lo, int64_t hi, const void* data,
                                      std::vector<char>& buf, StreamingWriteback* writeback) {
  if (lo >= hi) return {};
  const auto chunk = chunk_dims(dims);
  int64_t n = 1, per = 1;
  bool flat = true;  // chunks are contiguous ranges of the flattened dataset
  for (size_t i = 0; i < dims.size(); ++i) {
    n *= dims[i];
    per *= chunk[i];
    if (i > 0) flat &= chunk[i] == dims[i];
  }
  // (Chunks go to the file as they are in memory: the checkpoint types are little-endian.)
  const uint16_t probe = 1;
  const bool little_endian = *reinterpret_cast<const uint8_t*>(&probe) == 1;
  const int64_t k0 = (lo + per - 1) / per;
  const int64_t k1 = hi == n ? (n + per - 1) / per : hi / per;  // the edge chunk is whole
  if (!flat || !little_endian || k0 >= k1) return {{lo, hi}};
  const size_t es = element_size, bytes = static_cast<size_t>(per) * es;
  buf.resize(bytes + 4);
  std::vector<hsize_t> offset(dims.size());
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t a = k * per, b = std::min(n, a + per);
    std::memcpy(buf.data(), static_cast<const char*>(data) + (a - lo) * es, (b - a) * es);
    // HDF5 stores edge chunks whole, the rest filled with the fill value (0).
    std::memset(buf.data() + (b - a) * es, 0, bytes - (b - a) * es);
    const uint32_t sum = fletcher32(buf.data(), bytes);
    for (int i = 0; i < 4; ++i) buf[bytes + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
    int64_t rest = a;  // the chunk's first element as an index into dims
    for (size_t i = dims.size(); i-- > 0;) {
      offset[i] = static_cast<hsize_t>(rest % dims[i]);
      rest /= dims[i];
    }
    KQLORA_H5(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset.data(), bytes + 4, buf.data()));
    if (writeback) writeback->wrote(static_cast<int64_t>(bytes) + 4);
  }
  std::vector<Range> left;
  if (lo < k0 * per) left.push_back({lo, k0 * per});
  if (std::min(n, k1 * per) < hi) left.push_back({k1 * per, hi});
  return left;
}

void write_dataset(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type,
                   const std::vector<int64_t>& dims, const void* data,
                   StreamingWriteback* writeback) {
  Handle ds = create_checkpoint_dataset(loc, name, file_type, dims);
  // Data already in the file's representation goes chunk by chunk straight into the file;
  // anything else (or what that leaves) through HDF5's conversion and filter pipeline.
  int64_t n = 1;
  for (const auto d : dims) n *= d;
  bool done = false;
  const size_t element_size = H5Tget_size(file_type);  // (0: an error)
  KQLORA_CHECK(element_size != 0, name << ": H5Tget_size failed");
  if (KQLORA_H5(H5Tequal(mem_type, file_type)) > 0) {
    std::vector<char> buf;
    done = write_whole_chunks(ds, dims, element_size, 0, n, data, buf, writeback).empty();
  }
  if (!done) {
    KQLORA_H5(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
    if (auto* w = writeback) w->wrote(n * static_cast<int64_t>(element_size));
  }
  ds.close();
}

}  // namespace kqlora::h5
