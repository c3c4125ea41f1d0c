// Issue 49's hostile inputs (docs/RELIABILITY.md, "Runs that learn nothing" and "Files a
// model is read from"): each case is refused with exit 2 and a message naming the file and
// the cause, or accepted with the note it deserves. The model is the GQA Llama of the
// reference cases (tests/data/llama_reference/gqa), copied and damaged one way at a time.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "kqlora/core/json.hpp"
#include "kqlora/core/sha256.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/nn/decoder_spec.hpp"
#include "mpi_launcher.hpp"

namespace {

namespace fs = std::filesystem;
const std::string bin = KQLORA_TEST_BIN_DIR;
const std::string model_case = std::string(KQLORA_TEST_DATA_DIR) + "/llama_reference/gqa";
constexpr int64_t kRows = 3, kT = 12, kVocab = 96;

std::string dir() {
  return bin + "/../tests/tmp_hostile";
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

int run(const std::string& cmd, std::string* out) {
  const std::string log = dir() + "/log";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  *out = read_text(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The reference case's token rows (ids and labels), as a test changes them.
struct Tokens {
  std::vector<int32_t> ids, labels;
};

Tokens reference_tokens() {
  auto f = kqlora::h5::open_file(model_case + "/data.h5");
  Tokens t;
  t.ids.resize(kRows * kT);
  t.labels.resize(kRows * kT);
  kqlora::h5::read_dataset(f, "input_ids", H5T_NATIVE_INT32, kRows * kT, t.ids.data(), "data");
  kqlora::h5::read_dataset(f, "labels", H5T_NATIVE_INT32, kRows * kT, t.labels.data(), "data");
  return t;
}

void write_tokens(const std::string& path, const Tokens& t, const int32_t* positions = nullptr,
                  const std::string& tokenizer_sha256 = "") {
  auto f = kqlora::h5::create_file(path);
  kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, kT},
                            t.ids.data());
  kqlora::h5::write_dataset(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, kT},
                            t.labels.data());
  if (positions)
    kqlora::h5::write_dataset(f, "position_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, kT},
                              positions);
  kqlora::h5::write_attribute(f, "vocab_size", int64_t(kVocab));
  if (!tokenizer_sha256.empty())
    kqlora::h5::write_attribute(f, "tokenizer_sha256", tokenizer_sha256);
  f.close();
}

class Hostile : public ::testing::Test {
 protected:
  std::string model = dir() + "/model";
  void SetUp() override {
    fs::remove_all(dir());
    fs::create_directories(dir());
    fs::copy(model_case, model);
    fs::remove(model + "/data.h5");
    write_text(dir() + "/deck.in", "model = causal_lm\nhf_model_dir = " + model +
                                       "\nsave_dir = " + dir() + "/checkpoints\n");
  }
  /// kqlora-train on `data` (and `extra` keys): its exit code, its output in *log.
  int train(const std::string& data, const std::string& extra, std::string* log,
            const std::string& env = "") {
    return run(env + bin + "/kqlora-train " + dir() + "/deck.in data_file=" + data +
                   " lora_rank=4 block_size=32 scaler_block_size=32 global_bs=3 num_steps=2 "
                   "optimizer=adamw lr=1e-2 " +
                   extra,
               log);
  }
  void edit_config(const std::function<void(kqlora::json::Value&)>& edit,
                   const std::string& path = "") {
    const std::string p = path.empty() ? model + "/config.json" : path;
    kqlora::json::Value doc = kqlora::json::parse(read_text(p), p);
    edit(doc);
    write_text(p, kqlora::json::write(doc));
  }
};

kqlora::json::Value number(double v) {
  kqlora::json::Value x;
  x.kind = kqlora::json::Value::Kind::number;
  x.number = v;
  return x;
}

kqlora::json::Value integer(int64_t v) {
  kqlora::json::Value x = number(static_cast<double>(v));
  x.is_integer = true;
  x.integer = v;
  return x;
}

void set(kqlora::json::Value& doc, const std::string& key, const kqlora::json::Value& v) {
  for (auto& [k, x] : doc.object)
    if (k == key) {
      x = v;
      return;
    }
  doc.object.emplace_back(key, v);
}

// A file that scores nothing: every label -100, or labels only at a row's first position
// (which nothing predicts), or packed rows whose positions are all 0 -- refused, training
// or evaluation alike, naming the file and the cause. Some rows scoring nothing: a note
// counting them, once, and the run goes on.
TEST_F(Hostile, FilesThatScoreNoLabelAreRefused) {
  std::string log;
  Tokens none = reference_tokens();
  std::fill(none.labels.begin(), none.labels.end(), -100);
  write_tokens(dir() + "/none.h5", none);
  EXPECT_EQ(train(dir() + "/none.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "none.h5: no label is scored: every label is -100")) << log;
  EXPECT_TRUE(has(log, "would learn nothing")) << log;
  EXPECT_FALSE(has(log, "step 1")) << log;

#ifdef KQLORA_TEST_MPIEXEC
  // Every rank reads the file and refuses it alike: exit 2 at once (not after
  // comm_timeout_s), each rank's message the same.
  const std::string np2 = mpi_launcher(2);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(train(dir() + "/none.h5", "comm_timeout_s=60", &log, np2), 2) << log;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30);
  EXPECT_TRUE(has(log, "none.h5: no label is scored: every label is -100")) << log;
#endif

  Tokens first = none;
  for (int r = 0; r < kRows; ++r) first.labels[r * kT] = first.ids[r * kT + 1];
  write_tokens(dir() + "/first.h5", first);
  EXPECT_EQ(train(dir() + "/first.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "its 3 labels are all at a document's first position")) << log;

  Tokens packed = reference_tokens();
  std::vector<int32_t> zeros(kRows * kT, 0);
  write_tokens(dir() + "/zeros.h5", packed, zeros.data());
  EXPECT_EQ(train(dir() + "/zeros.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "zeros.h5: no label is scored")) << log;
  EXPECT_TRUE(has(log, "position_ids 0")) << log;

  write_tokens(dir() + "/good.h5", reference_tokens());
  EXPECT_EQ(train(dir() + "/good.h5", "eval_every=1 eval_file=" + dir() + "/none.h5", &log), 2)
      << log;
  EXPECT_TRUE(has(log, "eval_file " + dir() + "/none.h5: no label is scored")) << log;
  EXPECT_TRUE(has(log, "its loss would read 0")) << log;

  Tokens some = reference_tokens();
  for (int t = 0; t < kT; ++t) some.labels[1 * kT + t] = -100;
  write_tokens(dir() + "/some.h5", some);
  EXPECT_EQ(train(dir() + "/some.h5", "", &log), 0) << log;
  EXPECT_TRUE(has(log, "some.h5: 1 of 3 rows score no label (kept")) << log;
  size_t notes = 0;
  for (size_t at = log.find("rows score no label"); at != std::string::npos;
       at = log.find("rows score no label", at + 1))
    ++notes;
  EXPECT_EQ(notes, 1u) << log;
}

// tokenizer_sha256 against hf_model_dir's tokenizer (tokenizer.json, else tokenizer.model):
// the SHA-256 of its bytes (FIPS 180-4 vectors first), refused when it differs, noted when
// either side has none, not compared with tokenizer_check = off (and the log says so).
TEST_F(Hostile, TokenFilesOfAnotherTokenizerAreRefused) {
  EXPECT_EQ(kqlora::sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(kqlora::sha256_hex("", 0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(kqlora::sha256_hex(two.data(), two.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

  std::string log;
  write_text(model + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}\n");
  const std::string mine = kqlora::sha256_hex_of_file(model + "/tokenizer.json");
  const std::string other(64, 'a');
  write_tokens(dir() + "/other.h5", reference_tokens(), nullptr, other);
  EXPECT_EQ(train(dir() + "/other.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "other.h5: made with another tokenizer")) << log;
  EXPECT_TRUE(has(log, mine)) << log;
  EXPECT_TRUE(has(log, "tokenizer_check = off")) << log;

  EXPECT_EQ(train(dir() + "/other.h5", "tokenizer_check=off", &log), 0) << log;
  EXPECT_TRUE(has(log, "tokenizer_check = off: its tokenizer is not compared")) << log;

  write_tokens(dir() + "/mine.h5", reference_tokens(), nullptr, mine);
  EXPECT_EQ(train(dir() + "/mine.h5", "", &log), 0) << log;
  EXPECT_FALSE(has(log, "made with another tokenizer")) << log;
  EXPECT_FALSE(has(log, "not compared")) << log;

  write_tokens(dir() + "/unmarked.h5", reference_tokens());
  EXPECT_EQ(train(dir() + "/unmarked.h5", "", &log), 0) << log;
  EXPECT_TRUE(has(log, "unmarked.h5: no tokenizer_sha256 attribute")) << log;

  // tokenizer.model is the identity where there is no tokenizer.json.
  fs::remove(model + "/tokenizer.json");
  write_text(model + "/tokenizer.model", "sentencepiece bytes");
  EXPECT_EQ(train(dir() + "/mine.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, model + "/tokenizer.model")) << log;
}

// Ids, labels and positions stored as floats are refused (they would be truncated); int64
// values past int32 are named with their real value.
TEST_F(Hostile, FloatIdsAndHugeIdsAreRefusedByValue) {
  std::string log;
  const Tokens t = reference_tokens();
  {
    std::vector<float> ids(t.ids.begin(), t.ids.end());
    ids[5] += 0.5f;
    auto f = kqlora::h5::create_file(dir() + "/float.h5");
    kqlora::h5::write_dataset(f, "input_ids", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {kRows, kT},
                              ids.data());
    kqlora::h5::write_dataset(f, "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, kT},
                              t.labels.data());
    f.close();
  }
  EXPECT_EQ(train(dir() + "/float.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "float.h5: dataset 'input_ids' holds floating-point numbers")) << log;
  {
    std::vector<int64_t> labels(t.labels.begin(), t.labels.end());
    labels[kT + 4] = (int64_t(1) << 31) + 7;
    auto f = kqlora::h5::create_file(dir() + "/wide.h5");
    kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, {kRows, kT},
                              t.ids.data());
    kqlora::h5::write_dataset(f, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {kRows, kT},
                              labels.data());
    f.close();
  }
  EXPECT_EQ(train(dir() + "/wide.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "wide.h5: labels[1, 4] = 2147483655")) << log;
  EXPECT_FALSE(has(log, "2147483647")) << log;
  // int64 within int32's range reads as int32 would (ids and labels alike).
  {
    std::vector<int64_t> ids(t.ids.begin(), t.ids.end()), labels(t.labels.begin(), t.labels.end());
    auto f = kqlora::h5::create_file(dir() + "/int64.h5");
    kqlora::h5::write_dataset(f, "input_ids", H5T_STD_I64LE, H5T_NATIVE_INT64, {kRows, kT},
                              ids.data());
    kqlora::h5::write_dataset(f, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {kRows, kT},
                              labels.data());
    f.close();
  }
  write_tokens(dir() + "/int32.h5", t);
  std::string log32;
  EXPECT_EQ(train(dir() + "/int64.h5", "", &log), 0) << log;
  EXPECT_EQ(train(dir() + "/int32.h5", "", &log32), 0) << log32;
  auto losses = [](const std::string& text) {
    std::string out;
    for (size_t at = text.find("loss "); at != std::string::npos; at = text.find("loss ", at + 1))
      out += text.substr(at, 18) + "\n";
    return out;
  };
  EXPECT_FALSE(losses(log).empty());
  EXPECT_EQ(losses(log), losses(log32));
}

// NaN and Inf in a base tensor: refused at load, naming the tensor, the file and the place
// (an embedding row, a norm weight: dense tensors; a projection: NF4).
TEST_F(Hostile, NonFiniteBaseTensorsAreNamed) {
  write_tokens(dir() + "/good.h5", reference_tokens());
  const std::string weights = model + "/model.safetensors";
  const std::string pristine = read_text(weights);
  struct Case {
    std::string tensor;
    int64_t index;
    float value;
    std::string words;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c :
       {Case{"model.embed_tokens.weight", 70, NAN, "holds NaN at [1, 6]"},
        Case{"model.layers.1.input_layernorm.weight", 9, inf, "holds an infinity at [9]"},
        Case{"model.layers.0.self_attn.q_proj.weight", 64 * 3 + 2, -inf,
             "holds an infinity at [3, 2]"}}) {
    const auto h = kqlora::safetensors::read_header(weights);
    const auto* info = h.find(c.tensor);
    ASSERT_NE(info, nullptr) << c.tensor;
    std::string bytes = pristine;
    std::memcpy(&bytes[h.data_start + info->begin + 4 * c.index], &c.value, 4);
    write_text(weights, bytes);
    std::string log;
    EXPECT_EQ(train(dir() + "/good.h5", "", &log), 2) << c.tensor << "\n" << log;
    EXPECT_TRUE(has(log, weights + ": tensor '" + c.tensor + "' " + c.words)) << log;
    write_text(weights, pristine);
  }
  // A restart quantizes the base again (checkpoint_base = auto) and checks it again.
  std::string log;
  const std::string keys = "save_dir=" + dir() + "/ck checkpoint_every=1 ";
  ASSERT_EQ(train(dir() + "/good.h5", keys, &log), 0) << log;
  const auto h = kqlora::safetensors::read_header(weights);
  std::string bytes = pristine;
  const float nan = NAN;
  std::memcpy(&bytes[h.data_start + h.find("model.norm.weight")->begin + 4 * 3], &nan, 4);
  write_text(weights, bytes);
  EXPECT_EQ(train(dir() + "/good.h5", keys + "num_steps=3 restart=latest", &log), 2) << log;
  EXPECT_TRUE(has(log, weights + ": tensor 'model.norm.weight' holds NaN at [3]")) << log;
  write_text(weights, pristine);
}

// Sizes from config.json are bounded before anything is allocated from them; a rope_theta
// whose float32 frequencies are not finite and positive is bad input; Qwen2's sliding
// layers without use_sliding_window name it; a Gemma 2 soft-cap of 0 is refused.
TEST_F(Hostile, ConfigFieldsAreBoundedAndNamed) {
  write_tokens(dir() + "/good.h5", reference_tokens());
  const std::string pristine = read_text(model + "/config.json");
  // (the node's memory pinned to 16 GiB: the bounds do not depend on this machine's)
  auto expect = [&](const std::string& key, const kqlora::json::Value& v,
                    const std::string& words) {
    write_text(model + "/config.json", pristine);
    edit_config([&](kqlora::json::Value& d) { set(d, key, v); });
    std::string log;
    EXPECT_EQ(train(dir() + "/good.h5", "", &log, "KQLORA_MEMORY_LIMIT=17179869184 "), 2)
        << key << "\n"
        << log;
    EXPECT_TRUE(has(log, words)) << key << ": no '" << words << "'\n" << log;
    EXPECT_FALSE(has(log, "bad_alloc")) << log;
  };
  // Real sizes pass: Gemma 3's vocabulary of 262144 with a head_dim of 512, a 70B's 80
  // layers of 8192 (what the whole model needs is the memory check's: FSDP shards it).
  for (const auto& [family, sizes] :
       {std::make_pair(std::string("gemma3_text"),
                       std::vector<std::pair<std::string, int64_t>>{
                           {"vocab_size", 262144}, {"head_dim", 512}, {"hidden_size", 2560}}),
        std::make_pair(std::string("qwen2"),
                       std::vector<std::pair<std::string, int64_t>>{{"num_hidden_layers", 80},
                                                                    {"hidden_size", 8192},
                                                                    {"intermediate_size", 28672},
                                                                    {"num_attention_heads", 64},
                                                                    {"num_key_value_heads", 8},
                                                                    {"vocab_size", 152064}})}) {
    const std::string path =
        std::string(KQLORA_TEST_DATA_DIR) + "/family_reference/" + family + "/config.json";
    kqlora::json::Value doc = kqlora::json::parse(read_text(path), path);
    for (const auto& [key, v] : sizes) set(doc, key, integer(v));
    set(doc, "layer_types", kqlora::json::Value());  // (one a layer: left to the default)
    kqlora::DecoderSpec spec;
    EXPECT_NO_THROW(spec = kqlora::parse_decoder_config(kqlora::json::write(doc), family))
        << family;
    for (const auto& [key, v] : sizes)
      if (key == "vocab_size") EXPECT_EQ(spec.vocab, v) << family;
  }
  expect("head_dim", integer(int64_t(1) << 30), "'head_dim' is 1073741824: q_proj would hold");
  expect("head_dim", integer(512), "'head_dim' is 512, more than 4 x hidden_size 64");
  expect("head_dim", integer(int64_t(1) << 34), "'head_dim' is 17179869184: q_proj would hold");
  expect("vocab_size", integer(int64_t(1) << 40), "'vocab_size' is 1099511627776: the embedding");
  expect("num_hidden_layers", integer(int64_t(1) << 40), "'num_hidden_layers' is 1099511627776");
  // (the fuzzer's: heads of 6.7e15 are named, the largest size the file gives)
  {
    write_text(model + "/config.json", pristine);
    edit_config(
        [&](kqlora::json::Value& d) { set(d, "num_attention_heads", integer(6666666666666664)); });
    std::string log;
    EXPECT_EQ(train(dir() + "/good.h5", "", &log, "KQLORA_MEMORY_LIMIT=17179869184 "), 2) << log;
    EXPECT_TRUE(has(log, "'num_attention_heads' is 6666666666666664: q_proj would hold")) << log;
  }
  kqlora::json::Value rope =
      kqlora::json::parse("{\"rope_theta\": 1e-300, \"rope_type\": \"default\"}", "rope");
  expect("rope_parameters", rope, "rope_theta");
  expect("rope_parameters", rope, "not finite and positive in float32");
  expect("rope_parameters",
         kqlora::json::parse(
             "{\"rope_theta\": 10000.0, \"rope_type\": \"linear\", \"factor\": 1e300}", "rope"),
         "'rope_parameters.factor' gives linear rope frequencies (or an attention factor) that are "
         "not finite");

  // Qwen2: a sliding layer while use_sliding_window is false.
  write_text(model + "/config.json", pristine);
  edit_config([&](kqlora::json::Value& d) {
    set(d, "model_type", kqlora::json::parse("\"qwen2\"", "t"));
    set(d, "layer_types", kqlora::json::parse("[\"full_attention\", \"sliding_attention\"]", "t"));
    set(d, "use_sliding_window", kqlora::json::parse("false", "t"));
    set(d, "sliding_window", integer(8));
  });
  std::string log;
  EXPECT_EQ(train(dir() + "/good.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "entry 1 is \"sliding_attention\", but use_sliding_window is false")) << log;

  // Gemma 2: a soft-cap of 0 (transformers divides by it); null is "none".
  write_text(model + "/config.json", pristine);
  edit_config([&](kqlora::json::Value& d) {
    set(d, "model_type", kqlora::json::parse("\"gemma2\"", "t"));
    set(d, "final_logit_softcapping", number(0));
  });
  EXPECT_EQ(train(dir() + "/good.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "'final_logit_softcapping' must be > 0 or null (no soft-cap), got 0"))
      << log;
}

// A pass-through filter registered under LZF's id writes a file only h5py's LZF could
// read: the trainer (another process, without it) names the filter and the cure.
htri_t can_apply(hid_t, hid_t, hid_t) {
  return 1;
}
size_t pass_through(unsigned, size_t, const unsigned[], size_t nbytes, size_t*, void**) {
  return nbytes;
}

TEST_F(Hostile, CompressionThisHdf5LacksIsNamed) {
  const H5Z_class2_t lzf = {
      H5Z_CLASS_T_VERS, static_cast<H5Z_filter_t>(32000), 1, 1, "lzf", can_apply, nullptr,
      pass_through};
  ASSERT_GE(H5Zregister(&lzf), 0);
  const Tokens t = reference_tokens();
  {
    auto f = kqlora::h5::create_file(dir() + "/lzf.h5");
    for (const auto& [name, data] :
         {std::make_pair("input_ids", &t.ids), std::make_pair("labels", &t.labels)}) {
      const hsize_t dims[2] = {kRows, kT};
      kqlora::h5::Handle space(H5Screate_simple(2, dims, nullptr));
      kqlora::h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
      ASSERT_GE(H5Pset_chunk(dcpl, 2, dims), 0);
      ASSERT_GE(H5Pset_filter(dcpl, 32000, H5Z_FLAG_OPTIONAL, 0, nullptr), 0);
      kqlora::h5::Handle d(
          H5Dcreate2(f, name, H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
      ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data->data()), 0);
    }
    f.close();
  }
  ASSERT_GE(H5Zunregister(static_cast<H5Z_filter_t>(32000)), 0);
  std::string log;
  EXPECT_EQ(train(dir() + "/lzf.h5", "", &log), 2) << log;
  EXPECT_TRUE(has(log, "lzf.h5: dataset 'input_ids' is compressed with filter 32000 (LZF")) << log;
  EXPECT_TRUE(has(log, "rewrite it with gzip or without compression")) << log;
  EXPECT_FALSE(has(log, "damaged")) << log;
}

// A restart compares the parsed model, not config.json's bytes: formatting and metadata
// pass (and the log says so); a changed field is named.
TEST_F(Hostile, RestartsCompareTheModelNotTheBytes) {
  write_tokens(dir() + "/good.h5", reference_tokens());
  std::string log;
  const std::string keys = "save_dir=" + dir() + "/ck checkpoint_every=1 ";
  ASSERT_EQ(train(dir() + "/good.h5", keys, &log), 0) << log;
  const std::string pristine = read_text(model + "/config.json");
  edit_config([](kqlora::json::Value& d) {
    set(d, "transformers_version", kqlora::json::parse("\"9.9.9\"", "t"));
  });
  write_text(model + "/config.json", "\n  " + read_text(model + "/config.json") + "\n\n");
  EXPECT_EQ(train(dir() + "/good.h5", keys + "num_steps=3 restart=latest", &log), 0) << log;
  EXPECT_TRUE(has(log, "in formatting or metadata only")) << log;

  write_text(model + "/config.json", pristine);
  edit_config([](kqlora::json::Value& d) { set(d, "rms_norm_eps", number(1e-3)); });
  EXPECT_EQ(train(dir() + "/good.h5", keys + "num_steps=4 restart=latest", &log), 2) << log;
  EXPECT_TRUE(has(log, "in rms_norm_eps: 1.0000000000000001e-05 vs 0.001")) << log;
}

// GGUF: a chat_template of another shape is refused, not dropped; a NaN reaching q8_0 (a
// trained adapter) names the tensor and the file.
TEST_F(Hostile, GgufExportsNameWhatTheyCannotWrite) {
  write_tokens(dir() + "/good.h5", reference_tokens());
  std::string log;
  ASSERT_EQ(train(dir() + "/good.h5", "save_dir=" + dir() + "/ck", &log), 0) << log;
  // (a byte-level BPE tokenizer.json of the model's 96 ids: the template is read with it)
  std::string vocab;
  for (int i = 0; i < kVocab; ++i)
    vocab += (i ? ", \"t" : "\"t") + std::to_string(i) + "\": " + std::to_string(i);
  write_text(model + "/tokenizer.json",
             "{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
             "\"vocab\": {" +
                 vocab + "}, \"merges\": [\"t 1\"]}}");
  write_text(model + "/tokenizer_config.json", "{\"chat_template\": 42}");
  EXPECT_EQ(run(bin + "/kqlora-export " + dir() + "/ck --gguf " + dir() + "/m.gguf", &log), 2)
      << log;
  EXPECT_TRUE(has(log, "tokenizer_config.json: chat_template is not a string")) << log;
  EXPECT_FALSE(fs::exists(dir() + "/m.gguf"));
  fs::remove(model + "/tokenizer_config.json");
  fs::remove(model + "/tokenizer.json");

  // An adapter's B made NaN in the checkpoint (its checksums rewritten by HDF5 itself).
  const std::string file = kqlora::checkpoint_files(dir() + "/ck").front();
  {
    kqlora::h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_GE(f.get(), 0);
    const std::string name = "params/model.layers.0.self_attn.q_proj.lora_b.weight";
    kqlora::h5::Handle d(H5Dopen2(f, name.c_str(), H5P_DEFAULT));
    ASSERT_GE(d.get(), 0) << name;
    std::vector<float> v(64 * 4);
    ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    v[5] = NAN;
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  }
  EXPECT_EQ(
      run(bin + "/kqlora-export " + dir() + "/ck --gguf " + dir() + "/q.gguf --gguf-type q8_0",
          &log),
      2)
      << log;
  EXPECT_TRUE(has(log, dir() + "/q.gguf: tensor 'blk.0.attn_q.weight': q8_0")) << log;
}

}  // namespace
