// HDF5 parameters in the checkpoint schema: NF4 groups round-trip exactly, bfloat16 uses the
// 2-byte float type (checked from Python by check_bf16_h5py.py on the file written here),
// checksums catch a flipped byte, and kqlora-quantize writes what nf4_quantize computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/fletcher32.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/io/safetensors.hpp"
#include "nf4_test_util.hpp"

using namespace nf4test;
using kqlora::bfloat16;

namespace {

std::string tmp(const std::string& name) {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_" + name;
}

/// XORs the byte at `offset` of the file with `mask` (damage a stored chunk).
void flip_bits(const std::string& path, uint64_t offset, char mask) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&c, 1);
}

void expect_same(const HostNf4& a, const HostNf4& b) {
  ASSERT_EQ(a.layout, b.layout);
  const auto& L = a.layout;
  EXPECT_EQ(0, std::memcmp(a.quantized_data.data(), b.quantized_data.data(), L.num_bytes()));
  EXPECT_EQ(0, std::memcmp(a.quantized_scalers.data(), b.quantized_scalers.data(), L.num_blocks()));
  EXPECT_EQ(0, std::memcmp(a.quantization_factor.data(), b.quantization_factor.data(),
                           4 * L.num_scaler_blocks()));
  EXPECT_EQ(a.scaler_mean, b.scaler_mean);
}

}  // namespace

TEST(Hdf5Params, Nf4GroupsRoundTripBothDtypes) {
  kqlora::Nf4Layout L;
  L.shape = {300, 64};
  const auto x = randn(L.numel(), 1);
  std::vector<bfloat16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bfloat16(x[i]);
  const auto f32 = quantize(x, L);
  const auto b16 = quantize(xb, L);
  {
    auto f = kqlora::h5::create_file(tmp("nf4.h5"));
    auto params = kqlora::h5::create_group(f, "params");
    kqlora::h5::write_nf4(params, "layers.0.weight", f32);
    kqlora::h5::write_nf4(params, "layers.1.weight", b16);
    f.close();
  }
  auto f = kqlora::h5::open_file(tmp("nf4.h5"));
  auto params = kqlora::h5::open_group(f, "params");
  EXPECT_TRUE(kqlora::h5::is_nf4_group(params, "layers.0.weight"));
  expect_same(kqlora::h5::read_nf4(params, "layers.0.weight", "nf4.h5"), f32);
  const auto back = kqlora::h5::read_nf4(params, "layers.1.weight", "nf4.h5");
  expect_same(back, b16);
  EXPECT_EQ(back.layout.dtype, kqlora::DType::bfloat16);
  H5T_class_t cls;
  size_t size;
  kqlora::h5::dataset_type(params, "layers.1.weight/quantization_factor", &cls, &size);
  EXPECT_EQ(size, 2u);  // stored as bfloat16, not widened
  EXPECT_THROW(kqlora::h5::read_nf4(params, "layers.9.weight", "nf4.h5"), kqlora::InputError);
}

TEST(Hdf5Params, WritesBfloat16ForPython) {
  // Values across the range, subnormals and signed zeros included; check_bf16_h5py.py
  // rounds `source` to bfloat16 itself and compares with what h5py reads from `bf16`.
  std::vector<float> src = randn(4096, 2);
  for (size_t i = 0; i < src.size(); i += 7)
    src[i] *= std::ldexp(1.0f, static_cast<int>(i % 200) - 100);
  src[1] = -0.0f;
  src[2] = std::ldexp(1.0f, -130);  // float32 subnormal
  src[3] = 3.0e38f;                 // rounds to bfloat16 infinity? no: 3e38 < max bf16 (3.39e38)
  std::vector<bfloat16> b(src.size());
  for (size_t i = 0; i < src.size(); ++i) b[i] = bfloat16(src[i]);
  auto f = kqlora::h5::create_file(tmp("bf16_for_h5py.h5"));
  kqlora::h5::write_float(f, "source", {64, 64}, src.data());
  kqlora::h5::write_bfloat16(f, "bf16", {64, 64}, b.data());
  f.close();
  // Reading back through HDF5's conversion to float gives the bfloat16 values exactly.
  auto r = kqlora::h5::open_file(tmp("bf16_for_h5py.h5"));
  std::vector<float> back(src.size());
  kqlora::h5::read_dataset(r, "bf16", H5T_NATIVE_FLOAT, 4096, back.data(), "bf16_for_h5py.h5");
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(back[i], static_cast<float>(b[i])) << i;
}

TEST(Hdf5Params, ChecksumCatchesAFlippedByte) {
  const std::string path = tmp("flip.h5");
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f + i;
  {
    auto f = kqlora::h5::create_file(path);
    kqlora::h5::write_float(f, "v", {1000}, v.data());
    f.close();
  }
  // Find the value 500.0f's bytes in the raw file and flip one bit.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const float needle = 500.0f;
  const auto pos = bytes.find(std::string(reinterpret_cast<const char*>(&needle), 4));
  ASSERT_NE(pos, std::string::npos);
  f.seekp(static_cast<std::streamoff>(pos));
  const char flipped = static_cast<char>(bytes[pos] ^ 0x10);
  f.write(&flipped, 1);
  f.close();
  auto r = kqlora::h5::open_file(path);
  std::vector<float> back(1000);
  try {
    kqlora::h5::read_dataset(r, "v", H5T_NATIVE_FLOAT, 1000, back.data(), path);
    ADD_FAILURE() << "a flipped byte was read without error";
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
}

TEST(QuantizeApp, WritesWhatTheKernelComputes) {
  const std::string bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-quantize";
  const auto w = randn(128 * 256, 3);
  std::vector<uint16_t> wb(64 * 256);
  std::vector<uint16_t> wh(64 * 128);
  for (size_t i = 0; i < wb.size(); ++i) wb[i] = bfloat16(w[i]).bits;
  for (size_t i = 0; i < wh.size(); ++i) wh[i] = 0x3c00;  // float16 1.0
  const std::vector<float> bias = randn(256, 4);
  const std::vector<float> odd = randn(10 * 10, 5);
  kqlora::safetensors::write(tmp("model.safetensors"),
                             {{"q.weight", "F32", {128, 256}, w.data(), 4 * w.size()},
                              {"k.weight", "BF16", {64, 256}, wb.data(), 2 * wb.size()},
                              {"v.weight", "F16", {64, 128}, wh.data(), 2 * wh.size()},
                              {"q.bias", "F32", {256}, bias.data(), 4 * bias.size()},
                              {"odd.weight", "F32", {10, 10}, odd.data(), 4 * odd.size()}});
  const std::string out = tmp("model_nf4.h5");
  std::remove(out.c_str());
  ASSERT_EQ(std::system((bin + " " + tmp("model.safetensors") + " " + out + " > " +
                         tmp("quantize.log") + " 2>&1")
                            .c_str()),
            0);
  kqlora::Nf4Layout L;
  L.shape = {128, 256};
  auto f = kqlora::h5::open_file(out);
  auto params = kqlora::h5::open_group(f, "params");
  expect_same(kqlora::h5::read_nf4(params, "q.weight", out), quantize(w, L));
  std::vector<bfloat16> kb(wb.size());
  for (size_t i = 0; i < wb.size(); ++i) kb[i] = bfloat16::from_bits(wb[i]);
  L.shape = {64, 256};
  expect_same(kqlora::h5::read_nf4(params, "k.weight", out), quantize(kb, L));
  const auto v = kqlora::h5::read_nf4(params, "v.weight", out);
  EXPECT_EQ(v.layout.dtype, kqlora::DType::float32);  // float16 widens to float32
  EXPECT_FALSE(kqlora::h5::is_nf4_group(params, "q.bias"));
  std::vector<float> bias_back(256);
  kqlora::h5::read_dataset(params, "q.bias", H5T_NATIVE_FLOAT, 256, bias_back.data(), out);
  EXPECT_EQ(bias_back, bias);
  EXPECT_FALSE(kqlora::h5::is_nf4_group(params, "odd.weight"));
  // The log names each tensor and its error.
  std::ifstream log(tmp("quantize.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("rel. Frobenius error"), std::string::npos) << text;
  EXPECT_NE(text.find("copied as float (1-D"), std::string::npos) << text;
  EXPECT_NE(text.find("3 quantized, 2 copied"), std::string::npos) << text;
}

TEST(QuantizeApp, BadInputExitsTwoAndWritesNothing) {
  const std::string bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-quantize";
  const std::string out = tmp("never.h5");
  std::remove(out.c_str());
  {
    std::ofstream bad(tmp("bad.safetensors"), std::ios::binary);
    bad << "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":";
  }
  for (const std::string& args :
       {tmp("bad.safetensors") + " " + out, tmp("missing.safetensors") + " " + out,
        tmp("model.safetensors") + " " + out + " --block-size 7",
        tmp("model.safetensors") + " " + out + " --frobnicate", std::string("onlyone")}) {
    const int rc = std::system((bin + " " + args + " > /dev/null 2>&1").c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << args << " -> " << rc;
    EXPECT_FALSE(std::ifstream(out).good()) << args;
    EXPECT_FALSE(std::ifstream(out + ".tmp").good()) << args;
  }
  EXPECT_EQ(std::system((bin + " --help > /dev/null").c_str()), 0);
}

TEST(Fletcher32, DirectChunksReadBackThroughHdf5) {
  // h5::write_dataset writes whole chunks itself (H5Dwrite_chunk, kqlora's checksum); HDF5
  // reads them back through its filter, which verifies every checksum: several chunks, an
  // edge chunk, 1 and 2 dimensions, three element sizes.
  namespace h5 = kqlora::h5;
  h5::quiet_errors();
  const std::string path = tmp("direct_chunks.h5");
  const int64_t n = (int64_t(1) << 20) * 2 + 12345;  // 3 chunks of float32, the last partial
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(i) * 0.5f - 7.0f;
  std::vector<int8_t> b(5000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int8_t>(i * 37);
  std::vector<float> m(3000 * 700);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i % 977);
  {
    h5::Handle file = h5::create_file(path);
    h5::write_dataset(file, "f", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n}, f.data());
    h5::write_dataset(file, "b", H5T_STD_I8LE, H5T_NATIVE_INT8, {5000}, b.data());
    h5::write_dataset(file, "m", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3000, 700}, m.data());
    const uint16_t h[3] = {0x3f80, 0xc040, 0x0001};  // bfloat16 1, -3, a denormal
    h5::write_dataset(file, "h", h5::bfloat16_type(), h5::bfloat16_type(), {3}, h);
    const int64_t one = -42;
    h5::write_dataset(file, "one", H5T_STD_I64LE, H5T_NATIVE_INT64, {1}, &one);
  }
  h5::Handle file = h5::open_file(path);
  auto read = [&](const char* name, hid_t type, void* out) {
    h5::Handle d(KQLORA_H5(H5Dopen2(file, name, H5P_DEFAULT)));
    KQLORA_H5(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out));
  };
  std::vector<float> f2(n), m2(m.size());
  std::vector<int8_t> b2(b.size());
  read("f", H5T_NATIVE_FLOAT, f2.data());
  read("b", H5T_NATIVE_INT8, b2.data());
  read("m", H5T_NATIVE_FLOAT, m2.data());
  EXPECT_EQ(f, f2);
  EXPECT_EQ(b, b2);
  EXPECT_EQ(m, m2);
  uint16_t h2[3] = {0, 0, 0};
  read("h", h5::bfloat16_type(), h2);
  EXPECT_EQ(h2[0], 0x3f80);
  EXPECT_EQ(h2[1], 0xc040);
  EXPECT_EQ(h2[2], 0x0001);
  int64_t one = 0;
  read("one", H5T_NATIVE_INT64, &one);
  EXPECT_EQ(one, -42);
  // The direct path was taken: the raw chunk is the data and kqlora's checksum.
  h5::Handle d(KQLORA_H5(H5Dopen2(file, "b", H5P_DEFAULT)));
  const hsize_t origin = 0;
  std::vector<char> raw(b.size() + 4);
  uint32_t mask = 1;
  KQLORA_H5(H5Dread_chunk(d, H5P_DEFAULT, &origin, &mask, raw.data()));
  EXPECT_EQ(mask, 0u);
  EXPECT_EQ(0, std::memcmp(raw.data(), b.data(), b.size()));
  const uint32_t sum = h5::fletcher32(b.data(), b.size());
  EXPECT_EQ(0, std::memcmp(raw.data() + b.size(), &sum, 4));  // (little-endian host)
  std::remove(path.c_str());
}

TEST(Fletcher32, MatchesHdf5sOwnFilter) {
  // HDF5 writes chunks through its Fletcher32 filter; H5Dread_chunk returns them raw, the
  // checksum in their last 4 bytes (little-endian). Sizes: odd byte counts, a partial last
  // block of 360 words, several blocks; random bytes and all 0xff (every sum wraps).
  namespace h5 = kqlora::h5;
  h5::quiet_errors();
  std::mt19937 rng(7);
  for (const size_t n : {1u, 2u, 3u, 719u, 720u, 721u, 4096u, 100001u, 1u << 20}) {
    for (const int fill : {-1, 0xff}) {
      std::vector<uint8_t> data(n);
      for (auto& b : data) b = fill < 0 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(fill);
      const std::string path = tmp("fletcher.h5");
      {  // through HDF5's own filter pipeline (h5::write_dataset would use ours)
        h5::Handle f = h5::create_file(path);
        h5::Handle d = h5::create_checkpoint_dataset(f, "x", H5T_STD_U8LE, {int64_t(n)});
        KQLORA_H5(H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
      }
      h5::Handle f = h5::open_file(path);
      h5::Handle d(KQLORA_H5(H5Dopen2(f, "x", H5P_DEFAULT)));
      hsize_t stored = 0;
      const hsize_t origin = 0;
      KQLORA_H5(H5Dget_chunk_storage_size(d, &origin, &stored));
      ASSERT_EQ(stored, n + 4);
      std::vector<uint8_t> raw(stored);
      uint32_t mask = 0;
      KQLORA_H5(H5Dread_chunk(d, H5P_DEFAULT, &origin, &mask, raw.data()));
      const uint32_t hdf5 =
          raw[n] | (raw[n + 1] << 8) | (raw[n + 2] << 16) | (uint32_t(raw[n + 3]) << 24);
      EXPECT_EQ(h5::fletcher32(data.data(), n), hdf5) << n << " bytes, fill " << fill;
      std::remove(path.c_str());
    }
  }
}

TEST(Hdf5Read, ChunkByChunkMatchesHdf5sPipelineAndCatchesDamage) {
  // Datasets written through HDF5's own filter pipeline (its checksums), read back by
  // h5::read_dataset chunk by chunk (kqlora's check): equal values, the chunk path taken
  // (its byte count), and a flipped byte in a middle chunk named as a failed checksum.
  // The uint8 dataset's last chunk has 2 elements: too short to take the 4 checksum bytes
  // of the chunk before it in place.
  namespace h5 = kqlora::h5;
  h5::quiet_errors();
  const std::string path = tmp("chunk_read.h5");
  const int64_t nu = (int64_t(1) << 21) + 2, nf = (int64_t(1) << 20) + 777;
  std::vector<uint8_t> u(nu);
  for (int64_t i = 0; i < nu; ++i) u[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  std::vector<float> f(nf), m(3000 * 700);
  for (int64_t i = 0; i < nf; ++i) f[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i % 1013) - 500.0f;
  {
    h5::Handle file = h5::create_file(path);
    auto put = [&](const char* name, hid_t ft, hid_t mt, std::vector<int64_t> dims, const void* p) {
      h5::Handle d = h5::create_checkpoint_dataset(file, name, ft, dims);
      KQLORA_H5(H5Dwrite(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, p));
    };
    put("u", H5T_STD_U8LE, H5T_NATIVE_UINT8, {nu}, u.data());
    put("f", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {nf}, f.data());
    put("m", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3000, 700}, m.data());
  }
  haddr_t middle = 0;
  {
    h5::Handle file = h5::open_file(path);
    const int64_t before = h5::read_stats().bytes;
    std::vector<uint8_t> u2(nu);
    std::vector<float> f2(nf), m2(m.size());
    h5::read_dataset(file, "u", H5T_NATIVE_UINT8, nu, u2.data(), path);
    h5::read_dataset(file, "f", H5T_NATIVE_FLOAT, nf, f2.data(), path);
    h5::read_dataset(file, "m", H5T_NATIVE_FLOAT, 3000 * 700, m2.data(), path);
    EXPECT_EQ(u, u2);
    EXPECT_EQ(f, f2);
    EXPECT_EQ(m, m2);
    // Chunks of 1 Mi elements (uint8: 3, float32 1-D: 2) and of 1497 rows of 700 (3), each
    // with its 4 checksum bytes.
    const int64_t m_chunk = 1497 * 700 * 4;
    EXPECT_EQ(h5::read_stats().bytes - before,
              3 * ((1 << 20) + 4) + 2 * ((1 << 22) + 4) + 3 * (m_chunk + 4));
    h5::Handle d(KQLORA_H5(H5Dopen2(file, "u", H5P_DEFAULT)));
    const hsize_t offset = hsize_t(1) << 20;
    unsigned mask = 0;
    hsize_t size = 0;
    KQLORA_H5(H5Dget_chunk_info_by_coord(d, &offset, &mask, &middle, &size));
  }
  flip_bits(path, middle + 1000, 0x04);
  h5::Handle file = h5::open_file(path);
  std::vector<uint8_t> u2(nu);
  try {
    h5::read_dataset(file, "u", H5T_NATIVE_UINT8, nu, u2.data(), path);
    ADD_FAILURE() << "a flipped byte was read without error";
  } catch (const kqlora::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("failed checksum"), std::string::npos) << what;
    EXPECT_NE(what.find("'u'"), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("element 1048576"), std::string::npos) << what;
  }
  std::remove(path.c_str());
}

TEST(Hdf5Read, RangesReadOnlyTheirChunksAndEqualTheWholeDataset) {
  // Elements [lo, hi) of checkpoint datasets (1-D: chunks of 1 Mi elements, the last
  // partial; 2-D: chunks of 1497 rows of 700) equal the values written, for ranges inside
  // one chunk, across chunk edges, ending 1 element past a chunk (its checksum bytes land
  // in place), exactly one chunk, the tail, empty; through HDF5's pipeline too (a read
  // converted to double). A flipped byte fails only the ranges whose chunks hold it.
  namespace h5 = kqlora::h5;
  h5::quiet_errors();
  const std::string path = tmp("range_read.h5");
  const int64_t per = int64_t(1) << 20, nf = 2 * per + 777, rows = 3000, cols = 700;
  std::vector<float> f(nf), m(rows * cols);
  for (int64_t i = 0; i < nf; ++i) f[i] = 0.5f * static_cast<float>(i % 100003) - 7.0f;
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i % 1019) * 0.125f;
  {
    h5::Handle file = h5::create_file(path);
    h5::write_dataset(file, "f", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {nf}, f.data());
    h5::write_dataset(file, "m", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {rows, cols}, m.data());
  }
  const int64_t mchunk = 1497 * cols, nm = rows * cols;
  const std::vector<std::pair<int64_t, int64_t>> f_ranges = {
      {0, nf},        {5, 17},       {per - 3, per + 5}, {0, per + 1},
      {per, 2 * per}, {nf - 10, nf}, {per - 1, nf},      {77, 77}};
  const std::vector<std::pair<int64_t, int64_t>> m_ranges = {
      {0, nm}, {mchunk - 1, mchunk + 1}, {mchunk, 2 * mchunk}, {3, mchunk + 2}, {nm - 1, nm}};
  h5::Handle file = h5::open_file(path);
  auto check = [&](const char* name, const std::vector<float>& v, int64_t lo, int64_t hi) {
    std::vector<float> out(static_cast<size_t>(hi - lo) + 1, -1.0f);  // +1: must stay
    h5::read_dataset_range(file, name, H5T_NATIVE_FLOAT, lo, hi, out.data(), path);
    EXPECT_TRUE(std::equal(v.begin() + lo, v.begin() + hi, out.begin()))
        << name << " [" << lo << ", " << hi << ")";
    EXPECT_EQ(out.back(), -1.0f) << name << " [" << lo << ", " << hi << "): wrote past hi";
    std::vector<double> d(static_cast<size_t>(hi - lo));
    h5::read_dataset_range(file, name, H5T_NATIVE_DOUBLE, lo, hi, d.data(), path);
    for (int64_t i = lo; i < hi; ++i) ASSERT_EQ(d[i - lo], static_cast<double>(v[i])) << name << i;
  };
  for (const auto& [lo, hi] : f_ranges) check("f", f, lo, hi);
  for (const auto& [lo, hi] : m_ranges) check("m", m, lo, hi);
  // Only the chunks a range touches are read (each with its 4 checksum bytes).
  const int64_t before = h5::read_stats().bytes;
  std::vector<float> out(8);
  h5::read_dataset_range(file, "f", H5T_NATIVE_FLOAT, per - 3, per + 5, out.data(), path);
  EXPECT_EQ(h5::read_stats().bytes - before, 2 * (4 * per + 4));
  EXPECT_THROW(h5::read_dataset_range(file, "f", H5T_NATIVE_FLOAT, 5, nf + 1, out.data(), path),
               kqlora::InputError);
  // A flipped byte in f's second chunk.
  haddr_t second = 0;
  {
    h5::Handle d(KQLORA_H5(H5Dopen2(file, "f", H5P_DEFAULT)));
    const hsize_t offset = static_cast<hsize_t>(per);
    unsigned mask = 0;
    hsize_t size = 0;
    KQLORA_H5(H5Dget_chunk_info_by_coord(d, &offset, &mask, &second, &size));
  }
  file.reset();
  flip_bits(path, second + 4000, 0x10);
  file = h5::open_file(path);
  h5::read_dataset_range(file, "f", H5T_NATIVE_FLOAT, 0, 8, out.data(), path);  // chunk 0
  EXPECT_TRUE(std::equal(f.begin(), f.begin() + 8, out.begin()));
  try {
    h5::read_dataset_range(file, "f", H5T_NATIVE_FLOAT, per + 2000, per + 2008, out.data(), path);
    ADD_FAILURE() << "a flipped byte was read without error";
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("failed checksum"), std::string::npos) << e.what();
  }
  file.reset();
  std::remove(path.c_str());
}
