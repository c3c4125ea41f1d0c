#pragma once
// A GGUF v3 file (llama.cpp's model format; docs/GGUF.md): metadata key/values, tensor
// descriptions, then each tensor's data aligned to general.alignment (32), written in one
// pass with the tensors' values streamed in one at a time (never the whole model in
// memory), into a temporary file renamed over the target when complete.
//
// Tensor types: F32, F16 (nearest even), BF16 (nearest even, NaN quiet) and Q8_0 (blocks
// of 32: a float16 scale max|x| / 127, then round-half-away(x / scale) as int8), each
// bit-identical to the gguf Python package's encoders (its quants.Q8_0 follows ggml).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kqlora::gguf {

/// ggml's tensor type numbers.
enum class TensorType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

/// "f32", "f16", "bf16", "q8_0" (InputError naming `what` otherwise).
TensorType tensor_type_from_name(const std::string& name, const std::string& what);
const char* tensor_type_name(TensorType t);

/// Bytes of n values of type t (q8_0: n a multiple of 32).
int64_t tensor_bytes(TensorType t, int64_t n);

/// x [n] encoded as type t into out [tensor_bytes(t, n)].
void encode(TensorType t, const float* x, int64_t n, uint8_t* out);

class Writer {
 public:
  // Metadata, in the order added (keys must be unique).
  void add(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, uint32_t value);
  void add_i32(const std::string& key, int32_t value);
  void add_f32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  void add_strings(const std::string& key, const std::vector<std::string>& values);
  void add_i32s(const std::string& key, const std::vector<int32_t>& values);
  void add_f32s(const std::string& key, const std::vector<float>& values);
  void add_bools(const std::string& key, const std::vector<bool>& values);

  /// A tensor of row-major `shape` (GGUF stores the dimensions fastest first) and type.
  void add_tensor(const std::string& name, const std::vector<int64_t>& shape, TensorType type);

  /// Writes the file: metadata, tensor descriptions, then tensor i's values from
  /// `values(i, buffer)` (buffer resized to the tensor's element count by the caller of
  /// this function; the callback fills it). Errors name `path`; a failed write leaves
  /// no file at `path`.
  void write(const std::string& path,
             const std::function<void(size_t, std::vector<float>&)>& values) const;

  size_t tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    TensorType type;
  };
  std::vector<uint8_t> kv_;  // the encoded key/value pairs
  std::vector<std::string> keys_;
  std::vector<Tensor> tensors_;
  void key(const std::string& key, uint32_t value_type);
  template <class T>
  void add_array(const std::string& key, uint32_t element_type, const std::vector<T>& values);
};

}  // namespace kqlora::gguf
