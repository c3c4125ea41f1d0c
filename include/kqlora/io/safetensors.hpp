#pragma once
// safetensors files: an 8-byte little-endian header length, a JSON header, the data.
// Reading validates the header fully before any tensor is used: length bounds, known
// dtypes, shapes and byte counts that agree, offsets inside the file, no overlaps.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kqlora::safetensors {

/// Largest header accepted (the safetensors reference implementation's limit).
constexpr uint64_t max_header_bytes = 100000000;

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

struct Header {
  std::string path;
  uint64_t data_start = 0;  // 8 + header length
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  const TensorInfo* find(const std::string& name) const;
};

/// Bytes per element of a safetensors dtype; throws InputError for an unknown one.
int dtype_size(const std::string& dtype, const std::string& where);

Header read_header(const std::string& path);
/// The raw bytes of one tensor.
std::vector<uint8_t> read_bytes(const Header& h, const TensorInfo& t);

/// A float tensor (F32, BF16, F16) widened to float32 into dst [t.numel()], read in pieces
/// of a few MiB: no copy of the whole tensor's bytes exists besides dst (reading a model's
/// largest tensors this way keeps set-up's memory at the model's own size). InputError for
/// other dtypes.
void read_f32_into(const Header& h, const TensorInfo& t, float* dst);
/// The same for elements [first, first + n) of the row-major tensor (an expert's slice of a
/// fused [E, ...] parameter).
void read_f32_range_into(const Header& h, const TensorInfo& t, int64_t first, int64_t n,
                         float* dst);
/// `n` bytes from element `first` of a U8 tensor into dst (InputError for another dtype).
void read_u8_range_into(const Header& h, const TensorInfo& t, int64_t first, int64_t n,
                        uint8_t* dst);

struct TensorToWrite {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

/// Writes a safetensors file (tensors in the given order, header padded to 8 bytes).
void write(const std::string& path, const std::vector<TensorToWrite>& tensors,
           const std::map<std::string, std::string>& metadata = {});

/// The shard files of a sharded checkpoint's model.safetensors.index.json, each once, in
/// first-mention order, as paths next to the index; checks every weight_map entry is a
/// string naming a relative .safetensors file.
std::vector<std::string> index_shards(const std::string& index_path,
                                      std::map<std::string, std::string>* weight_map = nullptr);

}  // namespace kqlora::safetensors
