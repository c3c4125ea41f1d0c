#pragma once
// Named float tensors from a file, loaded one at a time: a .safetensors file, a sharded
// checkpoint through its model.safetensors.index.json, or an HDF5 file of float datasets
// (a checkpoint's /params when it has one).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kqlora/core/bfloat16.hpp"

namespace kqlora {

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string source_dtype;  // as stored: F32, BF16, F16 (safetensors names), F64
  bool is_bf16 = false;      // values in `bf16` (else in `f32`; float16 widens to float32)
  std::vector<float> f32;
  std::vector<bfloat16> bf16;
  int64_t numel() const;
};

class TensorSource {
 public:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::string dtype;  // safetensors dtype name; float types are F32, BF16, F16, F64
    bool is_float() const { return dtype == "F32" || dtype == "BF16" || dtype == "F16"; }
  };
  virtual ~TensorSource() = default;
  virtual const std::vector<Entry>& entries() const = 0;
  /// Loads one float tensor (F32, BF16 or F16); InputError for other dtypes.
  virtual HostTensor load(const std::string& name) const = 0;
  /// The same widened to float32 into dst [numel]: no copy of the tensor besides dst
  /// where the source can stream it (safetensors), through load() otherwise. InputError
  /// naming the tensor, its file and the place of the first NaN or Inf (checked in the
  /// same pass).
  virtual void load_f32(const std::string& name, float* dst) const;
  /// `count` values from element `first` of a float tensor (row-major), widened to float32
  /// into dst, NaN and Inf refused as load_f32 does.
  virtual void load_f32_range(const std::string& name, int64_t first, int64_t count,
                              float* dst) const;
  /// `count` bytes from element `first` of a U8 tensor (MXFP4 blocks and scales) into dst;
  /// InputError for another dtype, or a source that holds none (HDF5).
  virtual void load_u8_range(const std::string& name, int64_t first, int64_t count,
                             uint8_t* dst) const;
  /// The file messages name.
  virtual std::string origin() const = 0;
  /// Every file the tensors are read from (a sharded checkpoint's shards).
  virtual std::vector<std::string> files() const = 0;
};

/// Opens `path` by its content: HDF5 signature, safetensors header, or JSON index.
std::unique_ptr<TensorSource> open_tensor_source(const std::string& path);

}  // namespace kqlora
