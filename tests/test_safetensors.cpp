// safetensors: a file written by the Python safetensors package (tests/data), our writer's
// round trip, sharded indexes, and every kind of malformed header rejected with a message.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "kqlora/core/error.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/io/tensor_source.hpp"

namespace st = kqlora::safetensors;

namespace {

std::string tmp(const std::string& name) {
  return std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_" + name;
}

// A file from a header text and a data section.
std::string make_file(const std::string& name, const std::string& header, size_t data_bytes,
                      uint64_t claimed_len = 0) {
  const std::string path = tmp(name);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = claimed_len ? claimed_len : header.size();
  unsigned char len8[8];
  for (int i = 0; i < 8; ++i) len8[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len8), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  const std::string data(data_bytes, '\x01');
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

void expect_rejected(const std::string& path, const std::string& needle) {
  try {
    st::read_header(path);
    ADD_FAILURE() << "accepted " << path << "; expected: " << needle;
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Safetensors, ReadsFileFromPythonPackage) {
  // tools/gen_safetensors_fixture.py: value[i] = (i - 5) / 8 for every tensor (exact in
  // every dtype), plus an int64 tensor and metadata.
  auto src = kqlora::open_tensor_source(std::string(KQLORA_TEST_DATA_DIR) +
                                        "/safetensors/fixture.safetensors");
  ASSERT_EQ(src->entries().size(), 4u);
  for (const char* name : {"w_f32", "w_bf16", "w_f16"}) {
    const auto t = src->load(name);
    ASSERT_EQ(t.shape, (std::vector<int64_t>{3, 4})) << name;
    for (int i = 0; i < 12; ++i) {
      const float v = t.is_bf16 ? static_cast<float>(t.bf16[i]) : t.f32[i];
      EXPECT_EQ(v, (i - 5) / 8.0f) << name << " " << i;
    }
  }
  EXPECT_TRUE(src->load("w_bf16").is_bf16);
  EXPECT_THROW(src->load("ids"), kqlora::InputError);  // I64 is not a float tensor
  const auto h =
      st::read_header(std::string(KQLORA_TEST_DATA_DIR) + "/safetensors/fixture.safetensors");
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(Safetensors, WriterRoundTripsAndShardedIndexReads) {
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t b[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};  // bfloat16 1, 2, -1, 0
  st::write(tmp("shard1.safetensors"), {{"a", "F32", {2, 3}, a, sizeof a}}, {{"k", "v"}});
  st::write(tmp("shard2.safetensors"), {{"b", "BF16", {4}, b, sizeof b}});
  {
    std::ofstream idx(tmp("index.json"));
    idx << R"({"metadata": {"total_size": 32}, "weight_map": {"a": "tmp_shard1.safetensors", )"
        << R"("b": "tmp_shard2.safetensors"}})";
  }
  auto src = kqlora::open_tensor_source(tmp("index.json"));
  ASSERT_EQ(src->entries().size(), 2u);
  const auto ta = src->load("a");
  EXPECT_EQ(ta.f32, std::vector<float>(a, a + 6));
  const auto tb = src->load("b");
  ASSERT_TRUE(tb.is_bf16);
  EXPECT_EQ(static_cast<float>(tb.bf16[2]), -1.0f);
  EXPECT_EQ(st::read_header(tmp("shard1.safetensors")).metadata.at("k"), "v");
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  EXPECT_NO_THROW(st::read_header(make_file("ok.st", ok, 16)));
  {  // truncated: shorter than the length field, and a data section cut short
    std::ofstream(tmp("tiny.st")) << "abc";
    expect_rejected(tmp("tiny.st"), "shorter than the 8-byte header length");
    expect_rejected(make_file("trunc.st", ok, 10), "lies past the data section");
  }
  expect_rejected(make_file("huge.st", ok, 16, uint64_t(1) << 62), "out of bounds");
  expect_rejected(make_file("pastend.st", ok, 16, 5000), "runs past the end");
  expect_rejected(
      make_file("offsets.st", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]}})", 16),
      "lies past the data section");
  expect_rejected(make_file("overlap.st",
                            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            16),
                  "overlap");
  expect_rejected(
      make_file("count.st", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16),
      "16 bytes for 3 elements of F32");
  expect_rejected(
      make_file("dtype.st", R"({"t":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}})", 16),
      "unknown dtype 'Q4'");
  expect_rejected(
      make_file("reversed.st", R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 16),
      "reversed");
  expect_rejected(make_file("notobj.st", "[1,2]", 0), "must be a JSON object");
  expect_rejected(make_file("badjson.st", R"({"t": {)", 0), "JSON error");
  expect_rejected(make_file("noshape.st", R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4),
                  "missing array 'shape'");
  expect_rejected(
      make_file("negshape.st", R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
      "non-negative integers");
  expect_rejected(make_file("hugeshape.st",
                            R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                            R"("data_offsets":[0,0]}})",
                            4),
                  "more elements than the file has bytes");
  expect_rejected(make_file("meta.st", R"({"__metadata__":{"a":1}})", 0), "not a string");
}

TEST(Safetensors, IndexMustNameFilesBesideIt) {
  {
    std::ofstream idx(tmp("bad_index.json"));
    idx << R"({"weight_map": {"a": "../../etc/passwd"}})";
  }
  EXPECT_THROW(kqlora::open_tensor_source(tmp("bad_index.json")), kqlora::InputError);
  {
    std::ofstream idx(tmp("noweights.json"));
    idx << R"({"metadata": {}})";
  }
  EXPECT_THROW(kqlora::open_tensor_source(tmp("noweights.json")), kqlora::InputError);
}
