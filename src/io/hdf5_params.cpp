#include "kqlora/io/hdf5_params.hpp"

#include "kqlora/io/chunk_writer.hpp"

#include <algorithm>

namespace kqlora::h5 {

namespace {

hid_t file_type_of(DType t) {
  return t == DType::float32 ? H5T_IEEE_F32LE : bfloat16_type();
}

/// Components of the dtype are held as float; bfloat16 ones are written as bfloat16.
void write_dtype_values(hid_t loc, const std::string& name, DType t, const float* v, int64_t n,
                        StreamingWriteback* w) {
  if (t == DType::float32) {
    write_dataset(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n}, v, w);
  } else {
    std::vector<bfloat16> b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) b[i] = bfloat16(v[i]);
    write_dataset(loc, name, bfloat16_type(), bfloat16_type(), {n}, b.data(), w);
  }
}

}  // namespace

void write_nf4(hid_t loc, const std::string& name, const HostNf4& t, StreamingWriteback* w) {
  Handle g = create_group(loc, name);
  const Nf4Layout& L = t.layout;
  write_dataset(g, "quantized_data", H5T_STD_U8LE, H5T_NATIVE_UINT8, {L.num_bytes()},
                t.quantized_data.data(), w);
  write_dataset(g, "quantized_scalers", H5T_STD_I8LE, H5T_NATIVE_INT8, {L.num_blocks()},
                t.quantized_scalers.data(), w);
  write_dtype_values(g, "quantization_factor", L.dtype, t.quantization_factor.data(),
                     L.num_scaler_blocks(), w);
  write_dtype_values(g, "scaler_mean", L.dtype, &t.scaler_mean, 1, w);
  write_attribute(g, "shape", L.shape);
  write_attribute(g, "dtype", std::string(dtype_name(L.dtype)));
  write_attribute(g, "block_size", L.block_size);
  write_attribute(g, "scaler_block_size", L.scaler_block_size);
}

void write_nf4_shard(hid_t loc, const std::string& name, const Nf4Shard<Kokkos::HostSpace>& s,
                     StreamingWriteback* w) {
  Handle g = create_group(loc, name);
  const Nf4Layout& L = s.global;
  const Nf4ShardRange& r = s.range;
  const int64_t half = L.block_size / 2;
  // Empty shards (more ranks than scaler blocks) store one-element placeholders: HDF5
  // chunked datasets cannot be empty; num_blocks = 0 says there is nothing in them.
  const int64_t nb = std::max<int64_t>(r.num_blocks, 1),
                nsb = std::max<int64_t>(r.num_scaler_blocks, 1);
  write_dataset(g, "quantized_data", H5T_STD_U8LE, H5T_NATIVE_UINT8, {nb * half},
                s.quantized_data.data(), w);
  write_dataset(g, "quantized_scalers", H5T_STD_I8LE, H5T_NATIVE_INT8, {nb},
                s.quantized_scalers.data(), w);
  write_dtype_values(g, "quantization_factor", L.dtype, s.quantization_factor.data(), nsb, w);
  write_dtype_values(g, "scaler_mean", L.dtype, &s.scaler_mean, 1, w);
  write_attribute(g, "shape", std::vector<int64_t>{r.num_blocks * L.block_size});
  write_attribute(g, "global_shape", L.shape);
  write_attribute(g, "dtype", std::string(dtype_name(L.dtype)));
  write_attribute(g, "block_size", L.block_size);
  write_attribute(g, "scaler_block_size", L.scaler_block_size);
  write_attribute(g, "shard_index", int64_t(s.shard_index));
  write_attribute(g, "num_shards", int64_t(s.num_shards));
  write_attribute(g, "first_block", r.first_block);
  write_attribute(g, "num_blocks", r.num_blocks);
}

bool is_nf4_shard_group(hid_t loc, const std::string& name) {
  if (!is_nf4_group(loc, name)) return false;
  Handle g = open_group(loc, name);
  return has_attribute(g, "shard_index");
}

Nf4Shard<Kokkos::HostSpace> read_nf4_shard(hid_t loc, const std::string& name,
                                           const std::string& file) {
  const std::string where = file + ": NF4 shard '" + name + "'";
  Handle g = open_group(loc, name);
  Nf4Layout L;
  L.shape = read_int_attribute(g, "global_shape", where);
  L.dtype = parse_dtype(read_string_attribute(g, "dtype", where), where + ": attribute dtype");
  L.block_size = read_int64_attribute(g, "block_size", where);
  L.scaler_block_size = read_int64_attribute(g, "scaler_block_size", where);
  L.validate(where);
  const int index = static_cast<int>(read_int64_attribute(g, "shard_index", where));
  const int count = static_cast<int>(read_int64_attribute(g, "num_shards", where));
  KQLORA_INPUT_CHECK(count >= 1 && index >= 0 && index < count,
                     where << ": shard " << index << " of " << count << " does not exist");
  auto s = Nf4Shard<Kokkos::HostSpace>::allocate(L, index, count);
  const Nf4ShardRange& r = s.range;
  KQLORA_INPUT_CHECK(read_int64_attribute(g, "first_block", where) == r.first_block &&
                         read_int64_attribute(g, "num_blocks", where) == r.num_blocks,
                     where << ": first_block/num_blocks do not match shard " << index << " of "
                           << count << " of " << L.shape_string());
  Kokkos::deep_copy(s.quantized_data, uint8_t(0x77));  // device-wide: checkpoint read
  Kokkos::deep_copy(s.quantized_scalers, int8_t(0));   // device-wide: checkpoint read
  Kokkos::deep_copy(s.quantization_factor, 1.0f);      // device-wide: checkpoint read
  const int64_t nb = std::max<int64_t>(r.num_blocks, 1),
                nsb = std::max<int64_t>(r.num_scaler_blocks, 1);
  std::vector<uint8_t> data(static_cast<size_t>(nb * L.block_size / 2));
  std::vector<int8_t> scalers(static_cast<size_t>(nb));
  std::vector<float> factors(static_cast<size_t>(nsb));
  read_dataset(g, "quantized_data", H5T_NATIVE_UINT8, static_cast<int64_t>(data.size()),
               data.data(), where);
  read_dataset(g, "quantized_scalers", H5T_NATIVE_INT8, nb, scalers.data(), where);
  read_dataset(g, "quantization_factor", H5T_NATIVE_FLOAT, nsb, factors.data(), where);
  read_dataset(g, "scaler_mean", H5T_NATIVE_FLOAT, 1, &s.scaler_mean, where);
  std::copy(data.begin(), data.begin() + r.num_blocks * L.block_size / 2, s.quantized_data.data());
  std::copy(scalers.begin(), scalers.begin() + r.num_blocks, s.quantized_scalers.data());
  std::copy(factors.begin(), factors.begin() + r.num_scaler_blocks, s.quantization_factor.data());
  return s;
}

bool is_nf4_group(hid_t loc, const std::string& name) {
  if (!exists(loc, name)) return false;
  H5O_type_t type = H5O_TYPE_UNKNOWN;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  KQLORA_H5(H5Oget_info_by_name3(loc, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT));
#else
  H5O_info_t info;
  KQLORA_H5(H5Oget_info_by_name2(loc, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT));
#endif
  type = info.type;
  return type == H5O_TYPE_GROUP && exists(loc, name + "/quantized_data");
}

HostNf4 read_nf4(hid_t loc, const std::string& name, const std::string& file) {
  const std::string where = file + ": NF4 parameter '" + name + "'";
  KQLORA_INPUT_CHECK(exists(loc, name), where << " is missing");
  Handle g = open_group(loc, name);
  Nf4Layout L;
  L.shape = read_int_attribute(g, "shape", where);
  L.dtype = parse_dtype(read_string_attribute(g, "dtype", where), where + ": attribute dtype");
  const auto bs = read_int_attribute(g, "block_size", where);
  const auto sbs = read_int_attribute(g, "scaler_block_size", where);
  KQLORA_INPUT_CHECK(bs.size() == 1 && sbs.size() == 1,
                     where << ": block_size and scaler_block_size must be single integers");
  L.block_size = bs[0];
  L.scaler_block_size = sbs[0];
  L.validate(where);
  // The stored float types must match the dtype (a float32 factor in a bfloat16 tensor
  // would silently change values).
  for (const char* part : {"quantization_factor", "scaler_mean"}) {
    KQLORA_INPUT_CHECK(exists(g, part), where << ": dataset '" << part << "' is missing");
    H5T_class_t cls;
    size_t size;
    dataset_type(g, part, &cls, &size);
    KQLORA_INPUT_CHECK(cls == H5T_FLOAT && size == static_cast<size_t>(dtype_size(L.dtype)),
                       where << ": dataset '" << part << "' is not " << dtype_name(L.dtype));
  }
  for (const char* part : {"quantized_data", "quantized_scalers"}) {
    KQLORA_INPUT_CHECK(exists(g, part), where << ": dataset '" << part << "' is missing");
    H5T_class_t cls;
    size_t size;
    dataset_type(g, part, &cls, &size);
    KQLORA_INPUT_CHECK(cls == H5T_INTEGER && size == 1,
                       where << ": dataset '" << part << "' is not a byte array");
  }
  auto t = HostNf4::allocate(L);
  read_dataset(g, "quantized_data", H5T_NATIVE_UINT8, L.num_bytes(), t.quantized_data.data(),
               where);
  read_dataset(g, "quantized_scalers", H5T_NATIVE_INT8, L.num_blocks(), t.quantized_scalers.data(),
               where);
  read_dataset(g, "quantization_factor", H5T_NATIVE_FLOAT, L.num_scaler_blocks(),
               t.quantization_factor.data(), where);
  read_dataset(g, "scaler_mean", H5T_NATIVE_FLOAT, 1, &t.scaler_mean, where);
  return t;
}

void write_float(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                 const float* data, StreamingWriteback* w) {
  write_dataset(loc, name, file_type_of(DType::float32), H5T_NATIVE_FLOAT, shape, data, w);
}

void write_bfloat16(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                    const bfloat16* data, StreamingWriteback* w) {
  write_dataset(loc, name, bfloat16_type(), bfloat16_type(), shape, data, w);
}

}  // namespace kqlora::h5
