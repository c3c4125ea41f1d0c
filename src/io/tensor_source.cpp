#include "kqlora/io/tensor_source.hpp"

#include <algorithm>

#include <cstring>
#include <fstream>
#include <map>

#include "kqlora/build_config.hpp"
#include "kqlora/core/bit_cast.hpp"
#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/float16.hpp"
#include "kqlora/core/input_file.hpp"
#include "kqlora/core/non_finite.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/io/tensor_name.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/hdf5_file.hpp"
#endif

namespace kqlora {

int64_t HostTensor::numel() const {
  return checked_numel_of(shape, [&] { return "tensor '" + name + "'"; });
}

namespace {

class SafetensorsSource : public TensorSource {
 public:
  explicit SafetensorsSource(const std::vector<std::string>& files) {
    for (const auto& f : files) {
      headers_.push_back(safetensors::read_header(f));
      for (const auto& t : headers_.back().tensors) {
        KQLORA_INPUT_CHECK(where_.emplace(t.name, headers_.size() - 1).second,
                           f << ": tensor '" << t.name << "' is also in another shard");
        entries_.push_back({t.name, t.shape, t.dtype});
      }
    }
  }

  const std::vector<Entry>& entries() const override { return entries_; }

  HostTensor load(const std::string& name) const override {
    const auto it = where_.find(name);
    KQLORA_INPUT_CHECK(it != where_.end(), "no tensor '" << name << "'");
    const safetensors::Header& h = headers_[it->second];
    const safetensors::TensorInfo& info = *h.find(name);
    const auto bytes = safetensors::read_bytes(h, info);
    HostTensor t;
    t.name = name;
    t.shape = info.shape;
    t.source_dtype = info.dtype;
    const size_t n = static_cast<size_t>(info.numel());
    if (info.dtype == "F32") {
      t.f32.resize(n);
      // safetensors is little-endian, as x86/Arm. (An empty tensor has no bytes to copy:
      // a null source.)
      if (n > 0) std::memcpy(t.f32.data(), bytes.data(), 4 * n);
    } else if (info.dtype == "BF16") {
      t.is_bf16 = true;
      t.bf16.resize(n);
      if (n > 0) std::memcpy(t.bf16.data(), bytes.data(), 2 * n);
    } else if (info.dtype == "F16") {
      t.f32.resize(n);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h16;
        std::memcpy(&h16, bytes.data() + 2 * i, 2);
        t.f32[i] = half_to_float(h16);
      }
    } else {
      KQLORA_INPUT_CHECK(false, h.path << ": tensor '" << name << "' has dtype " << info.dtype
                                       << "; expected F32, BF16 or F16");
    }
    return t;
  }

  std::string origin() const override { return headers_.empty() ? "" : headers_.front().path; }
  std::vector<std::string> files() const override {
    std::vector<std::string> f;
    for (const auto& h : headers_) f.push_back(h.path);
    return f;
  }

  void load_f32(const std::string& name, float* dst) const override {
    const auto it = where_.find(name);
    KQLORA_INPUT_CHECK(it != where_.end(), "no tensor '" << name << "'");
    const safetensors::Header& h = headers_[it->second];
    safetensors::read_f32_into(h, *h.find(name), dst);
  }

  void load_f32_range(const std::string& name, int64_t first, int64_t count,
                      float* dst) const override {
    const auto it = where_.find(name);
    KQLORA_INPUT_CHECK(it != where_.end(), "no tensor '" << name << "'");
    const safetensors::Header& h = headers_[it->second];
    safetensors::read_f32_range_into(h, *h.find(name), first, count, dst);
  }

  void load_u8_range(const std::string& name, int64_t first, int64_t count,
                     uint8_t* dst) const override {
    const auto it = where_.find(name);
    KQLORA_INPUT_CHECK(it != where_.end(), "no tensor '" << name << "'");
    const safetensors::Header& h = headers_[it->second];
    safetensors::read_u8_range_into(h, *h.find(name), first, count, dst);
  }

 private:
  std::vector<safetensors::Header> headers_;
  std::map<std::string, size_t> where_;
  std::vector<Entry> entries_;
};

#if KQLORA_HAVE_HDF5
class Hdf5Source : public TensorSource {
 public:
  explicit Hdf5Source(const std::string& path) : path_(path) {
    h5::InputFileScope scope(path);
    file_ = h5::open_file(path);
    // A checkpoint keeps its tensors under /params; any other file is read from the root.
    prefix_ = h5::exists(file_, "params") ? "params/" : "";
    h5::Handle root = h5::open_group(file_, prefix_.empty() ? "/" : "params");
    for (const auto& name : h5::list_datasets(root)) {
      check_tensor_name(name, path + " (a dataset inside a group is not a tensor kqlora reads)");
      H5T_class_t cls;
      size_t size;
      h5::dataset_type(root, name, &cls, &size);
      std::string dtype = "other";
      // A 2-byte float is bfloat16 (8 exponent bits) or IEEE half (5): half widens to
      // float32 (docs/NF4.md), only bfloat16 stays bfloat16.
      if (cls == H5T_FLOAT && size == 2)
        dtype = h5::float_exponent_bits(root, name) == 8 ? "BF16" : "F16";
      else if (cls == H5T_FLOAT)
        dtype = size == 4 ? "F32" : size == 8 ? "F64" : dtype;
      if (cls == H5T_INTEGER) dtype = size == 1 ? "U8" : "I64";
      entries_.push_back({name, h5::dataset_dims(root, name, path), dtype});
    }
  }

  const std::vector<Entry>& entries() const override { return entries_; }
  std::string origin() const override { return path_; }
  std::vector<std::string> files() const override { return {path_}; }

  HostTensor load(const std::string& name) const override {
    const Entry* e = nullptr;
    for (const auto& x : entries_)
      if (x.name == name) e = &x;
    KQLORA_INPUT_CHECK(e, path_ << ": no dataset '" << name << "'");
    h5::InputFileScope scope(path_);
    KQLORA_INPUT_CHECK(
        e->dtype == "F32" || e->dtype == "BF16" || e->dtype == "F64" || e->dtype == "F16",
        path_ << ": dataset '" << name << "' is not a float dataset");
    HostTensor t;
    t.name = name;
    t.shape = e->shape;
    t.source_dtype = e->dtype;
    const std::string full = prefix_ + name;
    if (e->dtype == "BF16") {
      t.is_bf16 = true;
      t.bf16.resize(static_cast<size_t>(t.numel()));
      h5::read_dataset(file_, full, h5::bfloat16_type(), t.numel(), t.bf16.data(), path_);
    } else {
      t.f32.resize(static_cast<size_t>(t.numel()));
      h5::read_dataset(file_, full, H5T_NATIVE_FLOAT, t.numel(), t.f32.data(), path_);
    }
    return t;
  }

 private:
  std::string path_, prefix_;
  h5::Handle file_;
  std::vector<Entry> entries_;
};
#endif

}  // namespace

void TensorSource::load_f32_range(const std::string& name, int64_t first, int64_t count,
                                  float* dst) const {
  int64_t n = -1;
  for (const auto& e : entries())
    if (e.name == name) n = checked_numel(e.shape, origin() + ": tensor '" + name + "'");
  KQLORA_CHECK(first >= 0 && count >= 0 && first + count <= n,
               origin() << ": tensor '" << name << "': a range past its end");
  std::vector<float> whole(static_cast<size_t>(n));
  load_f32(name, whole.data());
  std::copy(whole.begin() + first, whole.begin() + first + count, dst);
}

void TensorSource::load_u8_range(const std::string& name, int64_t, int64_t, uint8_t*) const {
  KQLORA_INPUT_CHECK(false, origin() << ": tensor '" << name
                                     << "': bytes (MXFP4) are read from safetensors files only");
}

void TensorSource::load_f32(const std::string& name, float* dst) const {
  const HostTensor t = load(name);
  // (NaN and Inf looked for in the copy: one pass.)
  bool bad = false;
  const size_t n = t.is_bf16 ? t.bf16.size() : t.f32.size();
  for (size_t i = 0; i < n; ++i) {
    dst[i] = t.is_bf16 ? static_cast<float>(t.bf16[i]) : t.f32[i];
    bad |= (bit_cast<uint32_t>(dst[i]) & 0x7f800000u) == 0x7f800000u;
  }
  if (bad)
    refuse_non_finite(dst, static_cast<int64_t>(n), 0, t.shape,
                      origin() + ": tensor '" + name + "'");
}

std::unique_ptr<TensorSource> open_tensor_source(const std::string& path) {
  check_input_file(path, "a tensor file (safetensors or HDF5)");
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot open: " << std::strerror(errno));
  char head[8] = {0};
  f.read(head, 8);
  const std::streamsize got = f.gcount();
  static const char hdf5_sig[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  if (got == 8 && std::memcmp(head, hdf5_sig, 8) == 0) {
#if KQLORA_HAVE_HDF5
    return std::make_unique<Hdf5Source>(path);
#else
    KQLORA_INPUT_CHECK(false, path << ": an HDF5 file, but this kqlora was built without HDF5");
#endif
  }
  // A JSON index starts with '{' (after optional whitespace); a safetensors file with a
  // binary length.
  size_t i = 0;
  while (i < static_cast<size_t>(got) && std::isspace(static_cast<unsigned char>(head[i]))) ++i;
  if (i < static_cast<size_t>(got) && head[i] == '{') {
    return std::make_unique<SafetensorsSource>(safetensors::index_shards(path));
  }
  return std::make_unique<SafetensorsSource>(std::vector<std::string>{path});
}

}  // namespace kqlora
