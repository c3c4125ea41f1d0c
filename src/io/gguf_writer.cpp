#include "kqlora/io/gguf_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kqlora/core/atomic_output.hpp"
#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/float16.hpp"

namespace kqlora::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747u;  // "GGUF" in the file's (little-endian) bytes
constexpr uint32_t kVersion = 3;
constexpr int64_t kAlignment = 32;  // general.alignment's default
constexpr int64_t kQ8Block = 32;

// GGUF's metadata value types.
enum ValueType : uint32_t {
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};

template <class T>
void put(std::vector<uint8_t>& out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);  // (x86 and CUDA hosts: LE)
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

int64_t aligned(int64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

/// ggml's round-half-away-from-zero, as the gguf package's np_roundf.
int8_t round_away(float v) {
  return static_cast<int8_t>(std::round(v));
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

TensorType tensor_type_from_name(const std::string& name, const std::string& what) {
  for (TensorType t : {TensorType::f32, TensorType::f16, TensorType::bf16, TensorType::q8_0})
    if (name == tensor_type_name(t)) return t;
  KQLORA_INPUT_CHECK(false, what << ": expected f32, f16, bf16 or q8_0, got '" << name << "'");
  return TensorType::f32;
}

const char* tensor_type_name(TensorType t) {
  switch (t) {
    case TensorType::f32:
      return "f32";
    case TensorType::f16:
      return "f16";
    case TensorType::bf16:
      return "bf16";
    case TensorType::q8_0:
      return "q8_0";
  }
  return "?";
}

int64_t tensor_bytes(TensorType t, int64_t n) {
  switch (t) {
    case TensorType::f32:
      return 4 * n;
    case TensorType::f16:
    case TensorType::bf16:
      return 2 * n;
    case TensorType::q8_0:
      KQLORA_CHECK(n % kQ8Block == 0, "gguf: q8_0 needs a multiple of 32 values, got " << n);
      return n / kQ8Block * (2 + kQ8Block);
  }
  return 0;
}

void encode(TensorType t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case TensorType::f32:
      std::memcpy(out, x, 4 * n);
      return;
    case TensorType::f16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_half(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case TensorType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = bfloat16(x[i]).bits;
        std::memcpy(out + 2 * i, &b, 2);
      }
      return;
    case TensorType::q8_0:
      tensor_bytes(t, n);  // (checks n)
      for (int64_t b = 0; b < n / kQ8Block; ++b) {
        const float* v = x + b * kQ8Block;
        uint8_t* o = out + b * (2 + kQ8Block);
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = 0; i < kQ8Block; ++i) {
          amax = std::max(amax, std::fabs(v[i]));
          finite &= std::isfinite(v[i]);
        }
        KQLORA_INPUT_CHECK(finite,
                           "q8_0: a block of 32 values holds a NaN or an infinity (no "
                           "8-bit encoding)");
        // float32 throughout, as ggml and the gguf package: d = amax / 127, q = x * (1 / d).
        const float d = amax / 127.0f, inv = d == 0.0f ? 0.0f : 1.0f / d;
        const uint16_t dh = float_to_half(d);
        std::memcpy(o, &dh, 2);
        for (int64_t i = 0; i < kQ8Block; ++i)
          o[2 + i] = static_cast<uint8_t>(round_away(v[i] * inv));
      }
      return;
  }
}

void Writer::key(const std::string& key, uint32_t value_type) {
  KQLORA_CHECK(std::find(keys_.begin(), keys_.end(), key) == keys_.end(),
               "gguf: metadata key '" << key << "' added twice");
  keys_.push_back(key);
  put_string(kv_, key);
  put<uint32_t>(kv_, value_type);
}

void Writer::add(const std::string& k, const std::string& value) {
  key(k, kString);
  put_string(kv_, value);
}

void Writer::add_u32(const std::string& k, uint32_t value) {
  key(k, kU32);
  put(kv_, value);
}

void Writer::add_i32(const std::string& k, int32_t value) {
  key(k, kI32);
  put(kv_, value);
}

void Writer::add_f32(const std::string& k, float value) {
  key(k, kF32);
  put(kv_, value);
}

void Writer::add_bool(const std::string& k, bool value) {
  key(k, kBool);
  put<uint8_t>(kv_, value ? 1 : 0);
}

template <class T>
void Writer::add_array(const std::string& k, uint32_t element_type, const std::vector<T>& values) {
  key(k, kArray);
  put<uint32_t>(kv_, element_type);
  put<uint64_t>(kv_, values.size());
  for (const T& v : values) {
    if constexpr (std::is_same<T, std::string>::value)
      put_string(kv_, v);
    else
      put(kv_, v);
  }
}

void Writer::add_strings(const std::string& k, const std::vector<std::string>& values) {
  add_array(k, kString, values);
}

void Writer::add_i32s(const std::string& k, const std::vector<int32_t>& values) {
  add_array(k, kI32, values);
}

void Writer::add_f32s(const std::string& k, const std::vector<float>& values) {
  add_array(k, kF32, values);
}

void Writer::add_bools(const std::string& k, const std::vector<bool>& values) {
  add_array(k, kBool, std::vector<uint8_t>(values.begin(), values.end()));
}

void Writer::add_tensor(const std::string& name, const std::vector<int64_t>& shape,
                        TensorType type) {
  KQLORA_CHECK(!shape.empty() && shape.size() <= 4,
               "gguf: tensor '" << name << "' has " << shape.size() << " dims");
  for (const auto& t : tensors_)
    KQLORA_CHECK(t.name != name, "gguf: tensor '" << name << "' added twice");
  if (type == TensorType::q8_0)
    KQLORA_CHECK(shape.back() % kQ8Block == 0, "gguf: q8_0 tensor '"
                                                   << name << "' rows of " << shape.back()
                                                   << " values are not whole blocks of 32");
  tensors_.push_back({name, shape, type});
}

void Writer::write(const std::string& path,
                   const std::function<void(size_t, std::vector<float>&)>& values) const {
  std::vector<uint8_t> head;
  put(head, kMagic);
  put(head, kVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, keys_.size());
  head.insert(head.end(), kv_.begin(), kv_.end());
  std::vector<int64_t> numel(tensors_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    numel[i] = 1;
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) {  // fastest first
      put<uint64_t>(head, static_cast<uint64_t>(*d));
      numel[i] *= *d;
    }
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, static_cast<uint64_t>(offset));
    offset = aligned(offset + tensor_bytes(t.type, numel[i]));
  }
  head.resize(static_cast<size_t>(aligned(static_cast<int64_t>(head.size()))), 0);

  // A temporary beside the output, renamed at the end: a failure leaves an earlier file.
  FileOutput out(path);
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(out.temp().c_str(), "wb"));
  KQLORA_CHECK(f != nullptr,
               path << ": cannot open " << out.temp() << ": " << std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    f.reset();
    KQLORA_CHECK(false, path << ": " << what << " failed: " << std::strerror(err));
  };
  auto write_bytes = [&](const uint8_t* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f.get()) != n) fail("writing");
  };
  write_bytes(head.data(), head.size());
  std::vector<float> buf;
  std::vector<uint8_t> bytes;
  const std::vector<uint8_t> zeros(kAlignment, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    buf.assign(static_cast<size_t>(numel[i]), 0.0f);
    values(i, buf);
    KQLORA_CHECK(static_cast<int64_t>(buf.size()) == numel[i],
                 "gguf: tensor '" << tensors_[i].name << "' got " << buf.size() << " values, "
                                  << numel[i] << " expected");
    const int64_t n = tensor_bytes(tensors_[i].type, numel[i]);
    bytes.resize(static_cast<size_t>(n));
    try {
      encode(tensors_[i].type, buf.data(), numel[i], bytes.data());
    } catch (const InputError& e) {  // (which tensor, of which file)
      KQLORA_INPUT_CHECK(false, path << ": tensor '" << tensors_[i].name << "': " << e.what());
    }
    write_bytes(bytes.data(), bytes.size());
    if (i + 1 < tensors_.size()) write_bytes(zeros.data(), static_cast<size_t>(aligned(n) - n));
  }
  if (std::fflush(f.get()) != 0) fail("flushing");
  if (std::fclose(f.release()) != 0)
    KQLORA_CHECK(false, path << ": closing failed: " << std::strerror(errno));
  out.commit();
}

}  // namespace kqlora::gguf
