#include "kqlora/io/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "kqlora/core/atomic_output.hpp"
#include "kqlora/core/bit_cast.hpp"
#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/float16.hpp"
#include "kqlora/core/input_file.hpp"
#include "kqlora/core/json.hpp"
#include "kqlora/core/non_finite.hpp"
#include "kqlora/io/tensor_name.hpp"

namespace kqlora::safetensors {

int64_t TensorInfo::numel() const {
  return checked_numel_of(shape, [&] { return "tensor '" + name + "'"; });
}

const TensorInfo* Header::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

int dtype_size(const std::string& dtype, const std::string& where) {
  static const std::map<std::string, int> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2},  {"U32", 4}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  KQLORA_INPUT_CHECK(it != sizes.end(), where << ": unknown dtype '" << dtype << "'");
  return it->second;
}

namespace {

uint64_t file_size(std::ifstream& f, const std::string& path) {
  f.seekg(0, std::ios::end);
  const std::streamoff n = f.tellg();
  KQLORA_INPUT_CHECK(n >= 0, path << ": cannot determine the file size");
  f.seekg(0);
  return static_cast<uint64_t>(n);
}

uint64_t as_offset(const json::Value& v, const std::string& where) {
  KQLORA_INPUT_CHECK(v.kind == json::Value::Kind::number && v.is_integer && v.integer >= 0,
                     where << ": data_offsets must hold non-negative integers");
  return static_cast<uint64_t>(v.integer);
}

}  // namespace

Header read_header(const std::string& path) {
  check_input_file(path, "a safetensors file");
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot open: " << std::strerror(errno));
  const uint64_t size = file_size(f, path);
  KQLORA_INPUT_CHECK(size >= 8, path << ": not a safetensors file: " << size
                                     << " bytes, shorter than the 8-byte header length");
  unsigned char len8[8];
  f.read(reinterpret_cast<char*>(len8), 8);
  KQLORA_INPUT_CHECK(f.gcount() == 8,
                     path << ": cannot read the 8-byte header length: " << std::strerror(errno));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  KQLORA_INPUT_CHECK(n >= 2 && n <= max_header_bytes, path << ": header length " << n
                                                           << " is out of bounds (2.."
                                                           << max_header_bytes << ")");
  KQLORA_INPUT_CHECK(n <= size - 8, path << ": header length " << n << " runs past the end of the "
                                         << size << "-byte file (truncated?)");
  std::string text(n, '\0');
  f.read(&text[0], static_cast<std::streamsize>(n));
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot read the " << n << "-byte header");

  Header h;
  h.path = path;
  h.data_start = 8 + n;
  const uint64_t data_size = size - h.data_start;
  const json::Value doc = json::parse(text, path + " (header)");
  KQLORA_INPUT_CHECK(doc.kind == json::Value::Kind::object,
                     path << ": the header must be a JSON object, got " << doc.kind_name());
  for (const auto& kv : doc.object) {
    const std::string where = path + ": tensor '" + kv.first + "'";
    if (kv.first == "__metadata__") {
      KQLORA_INPUT_CHECK(kv.second.kind == json::Value::Kind::object,
                         path << ": __metadata__ must be an object");
      for (const auto& m : kv.second.object) {
        KQLORA_INPUT_CHECK(m.second.kind == json::Value::Kind::string,
                           path << ": __metadata__ value '" << m.first << "' is not a string");
        h.metadata[m.first] = m.second.string;
      }
      continue;
    }
    check_tensor_name(kv.first, path);
    const json::Value& e = kv.second;
    KQLORA_INPUT_CHECK(e.kind == json::Value::Kind::object, where << ": entry is not an object");
    const json::Value* dtype = e.find("dtype");
    const json::Value* shape = e.find("shape");
    const json::Value* offsets = e.find("data_offsets");
    KQLORA_INPUT_CHECK(dtype && dtype->kind == json::Value::Kind::string,
                       where << ": missing string 'dtype'");
    KQLORA_INPUT_CHECK(shape && shape->kind == json::Value::Kind::array,
                       where << ": missing array 'shape'");
    KQLORA_INPUT_CHECK(
        offsets && offsets->kind == json::Value::Kind::array && offsets->array.size() == 2,
        where << ": 'data_offsets' must be an array of two integers");
    TensorInfo t;
    t.name = kv.first;
    t.dtype = dtype->string;
    const int esize = dtype_size(t.dtype, where);
    uint64_t numel = 1;
    for (const auto& d : shape->array) {
      KQLORA_INPUT_CHECK(d.kind == json::Value::Kind::number && d.is_integer && d.integer >= 0,
                         where << ": shape entries must be non-negative integers");
      t.shape.push_back(d.integer);
      KQLORA_INPUT_CHECK(d.integer == 0 || numel <= data_size / static_cast<uint64_t>(d.integer),
                         where << ": shape holds more elements than the file has bytes");
      numel *= static_cast<uint64_t>(d.integer);
    }
    t.begin = as_offset(offsets->array[0], where);
    t.end = as_offset(offsets->array[1], where);
    KQLORA_INPUT_CHECK(t.begin <= t.end,
                       where << ": data_offsets [" << t.begin << ", " << t.end << "] are reversed");
    KQLORA_INPUT_CHECK(t.end <= data_size, where << ": data_offsets end " << t.end
                                                 << " lies past the data section of " << data_size
                                                 << " bytes (truncated file?)");
    KQLORA_INPUT_CHECK(t.end - t.begin == numel * static_cast<uint64_t>(esize),
                       where << ": " << (t.end - t.begin) << " bytes for " << numel
                             << " elements of " << t.dtype << " (expected "
                             << numel * static_cast<uint64_t>(esize) << ")");
    h.tensors.push_back(std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo*> order;
  for (const auto& t : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  const TensorInfo* reach = nullptr;  // the tensor reaching furthest so far
  for (const TensorInfo* t : order) {
    if (t->begin == t->end) continue;  // empty tensors hold no bytes
    KQLORA_INPUT_CHECK(!reach || t->begin >= reach->end,
                       path << ": tensors '" << reach->name << "' [" << reach->begin << ", "
                            << reach->end << ") and '" << t->name << "' [" << t->begin << ", "
                            << t->end << ") overlap");
    if (!reach || t->end > reach->end) reach = t;
  }
  return h;
}

std::vector<uint8_t> read_bytes(const Header& h, const TensorInfo& t) {
  std::ifstream f(h.path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), h.path << ": cannot open: " << std::strerror(errno));
  std::vector<uint8_t> out(t.end - t.begin);
  f.seekg(static_cast<std::streamoff>(h.data_start + t.begin));
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  KQLORA_INPUT_CHECK(f.good() || out.empty(),
                     h.path << ": tensor '" << t.name << "': short read (file changed?)");
  return out;
}

namespace {

/// The largest exponent field of n float32 bit patterns (all ones: a NaN or an infinity):
/// an integer max the compiler vectorises, over data just read (still in cache).
uint32_t max_exponent(const float* v, int64_t n) {
  uint32_t e = 0;
  for (int64_t i = 0; i < n; ++i) e = std::max(e, bit_cast<uint32_t>(v[i]) & 0x7f800000u);
  return e;
}

}  // namespace

void read_f32_into(const Header& h, const TensorInfo& t, float* dst) {
  read_f32_range_into(h, t, 0, t.numel(), dst);
}

void read_f32_range_into(const Header& h, const TensorInfo& t, int64_t first, int64_t n,
                         float* dst) {
  const int64_t width = t.dtype == "F32" ? 4 : (t.dtype == "BF16" || t.dtype == "F16") ? 2 : 0;
  KQLORA_INPUT_CHECK(width > 0, h.path << ": tensor '" << t.name << "' is " << t.dtype
                                       << ", expected F32, BF16 or F16");
  KQLORA_CHECK(first >= 0 && n >= 0 && first + n <= t.numel(),
               h.path << ": tensor '" << t.name << "': elements [" << first << ", " << first + n
                      << ") of " << t.numel());
  const bool bf16 = t.dtype == "BF16";
  std::ifstream f(h.path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), h.path << ": cannot open: " << std::strerror(errno));
  f.seekg(static_cast<std::streamoff>(h.data_start + t.begin + first * width));
  // Pieces small enough to stay in the L2 cache between the read and the look at them:
  // NaN and Inf (an exponent of all ones) are found in the same pass over the piece just
  // read, named with their place -- a base tensor that holds one would train or export
  // silently -- at a cost the set-up does not notice (kqlora-bench tensor_read_*).
  constexpr int64_t kPiece = int64_t(1) << 16;  // elements per read (128 - 256 KiB)
  std::vector<uint8_t> piece(static_cast<size_t>(std::min(n, kPiece) * width));
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t m = std::min(kPiece, n - i0);
    float* out = dst + i0;
    if (width == 4) {  // (little-endian in the file, as on x86 and Arm)
      f.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(4 * m));
    } else {
      f.read(reinterpret_cast<char*>(piece.data()), static_cast<std::streamsize>(2 * m));
      const uint8_t* src = piece.data();
      if (bf16) {  // (a plain loop the compiler vectorises)
        for (int64_t i = 0; i < m; ++i) {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);
          out[i] = bit_cast<float>(static_cast<uint32_t>(v) << 16);
        }
      } else {
        for (int64_t i = 0; i < m; ++i) {
          uint16_t v;
          std::memcpy(&v, src + 2 * i, 2);
          out[i] = half_to_float(v);
        }
      }
    }
    KQLORA_INPUT_CHECK(f.good(),
                       h.path << ": tensor '" << t.name << "': short read (file changed?)");
    if (max_exponent(out, m) == 0x7f800000u)
      refuse_non_finite(out, m, first + i0, t.shape, h.path + ": tensor '" + t.name + "'");
  }
}

void read_u8_range_into(const Header& h, const TensorInfo& t, int64_t first, int64_t n,
                        uint8_t* dst) {
  KQLORA_INPUT_CHECK(t.dtype == "U8", h.path << ": tensor '" << t.name << "' is " << t.dtype
                                             << ", expected U8 (MXFP4 blocks or scales)");
  KQLORA_CHECK(first >= 0 && n >= 0 && first + n <= t.numel(),
               h.path << ": tensor '" << t.name << "': bytes [" << first << ", " << first + n
                      << ") of " << t.numel());
  std::ifstream f(h.path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), h.path << ": cannot open: " << std::strerror(errno));
  f.seekg(static_cast<std::streamoff>(h.data_start + t.begin + first));
  f.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
  KQLORA_INPUT_CHECK(f.good() || n == 0,
                     h.path << ": tensor '" << t.name << "': short read (file changed?)");
}

void write(const std::string& path, const std::vector<TensorToWrite>& tensors,
           const std::map<std::string, std::string>& metadata) {
  std::ostringstream hdr;
  hdr << "{";
  bool first = true;
  if (!metadata.empty()) {
    hdr << "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      hdr << (it == metadata.begin() ? "" : ",") << json::quote(it->first) << ":"
          << json::quote(it->second);
    }
    hdr << "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    KQLORA_CHECK(static_cast<uint64_t>(numel) * dtype_size(t.dtype, t.name) == t.nbytes,
                 "safetensors::write: '" << t.name << "' has " << t.nbytes
                                         << " bytes for its shape and dtype");
    hdr << (first ? "" : ",") << json::quote(t.name) << ":{\"dtype\":\"" << t.dtype
        << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) hdr << (i ? "," : "") << t.shape[i];
    hdr << "],\"data_offsets\":[" << offset << "," << offset + t.nbytes << "]}";
    offset += t.nbytes;
    first = false;
  }
  hdr << "}";
  std::string text = hdr.str();
  while (text.size() % 8 != 0) text += ' ';  // data starts 8-byte aligned
  // A temporary beside the output, renamed at the end: a failure (a full disk: exit 1)
  // leaves an earlier file at `path` as it was.
  FileOutput out(path);
  std::ofstream f(out.temp(), std::ios::binary | std::ios::trunc);
  KQLORA_CHECK(f.good(), path << ": cannot open " << out.temp() << ": " << std::strerror(errno));
  unsigned char len8[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len8[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  f.write(reinterpret_cast<const char*>(len8), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors)
    f.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
  f.close();
  KQLORA_CHECK(!f.fail(), path << ": write failed: " << std::strerror(errno));
  out.commit();
}

std::vector<std::string> index_shards(const std::string& index_path,
                                      std::map<std::string, std::string>* weight_map) {
  std::ifstream f(index_path);
  KQLORA_INPUT_CHECK(f.good(), index_path << ": cannot open: " << std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  const json::Value doc = json::parse(ss.str(), index_path);
  const json::Value* wm = doc.kind == json::Value::Kind::object ? doc.find("weight_map") : nullptr;
  KQLORA_INPUT_CHECK(wm && wm->kind == json::Value::Kind::object,
                     index_path << ": no 'weight_map' object (not a safetensors index)");
  std::string dir = index_path.substr(0, index_path.find_last_of('/') + 1);
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& kv : wm->object) {
    KQLORA_INPUT_CHECK(kv.second.kind == json::Value::Kind::string,
                       index_path << ": weight_map['" << kv.first << "'] is not a file name");
    const std::string& file = kv.second.string;
    KQLORA_INPUT_CHECK(!file.empty() && file[0] != '/' && file.find("..") == std::string::npos,
                       index_path << ": weight_map['" << kv.first << "'] = '" << file
                                  << "' is not a file beside the index");
    if (weight_map) (*weight_map)[kv.first] = dir + file;
    if (seen.insert(file).second) files.push_back(dir + file);
  }
  return files;
}

}  // namespace kqlora::safetensors
