// Damaged and hostile input (docs/RELIABILITY.md): each case is one of the defects found on
// commit 35d580f, refused with exit 2 (InputError) naming the file or argument, or handled,
// never a crash, a wrong exit code or a run on silently wrong data.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/float16.hpp"
#include "kqlora/core/gpu_device.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/io/safetensors.hpp"
#include "kqlora/parallel/nccl_communicator.hpp"
#include "kqlora/quant/nf4_layout.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/memory_check.hpp"
#include "kqlora/train/trainer.hpp"
#include "nf4_test_util.hpp"

namespace {

const std::string bin = KQLORA_TEST_BIN_DIR;
std::string dir() {
  return bin + "/../tests/tmp_reliability";
}

int run(const std::string& cmd, std::string* out) {
  const std::string log = dir() + "/log";
  const int rc = std::system((cmd + " > " + log + " 2>&1").c_str());
  std::ifstream f(log);
  out->assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

const std::string small = " dim=64 num_linears=1 lora_rank=4 global_bs=2 log_every=100";

kqlora::Config deck(const std::string& keys) {
  std::vector<std::string> k;
  std::istringstream ss(small + " " + keys);
  for (std::string w; ss >> w;) k.push_back(w);
  return kqlora::parse_deck_text("", "test", k, 1);
}

/// What the InputError of `f` says ("" and a test failure when it does not throw one).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const kqlora::InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InputError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "accepted";
  return "";
}

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(std::system(("rm -rf " + dir() + " && mkdir -p " + dir()).c_str()), 0);
    write_text(dir() + "/empty.in", "# keys on the command line\n");
  }
  std::string train_cmd(const std::string& keys) const {
    return bin + "/kqlora-train " + dir() + "/empty.in" + small + " " + keys;
  }
};

}  // namespace

TEST_F(Reliability, DeckThatIsADirectoryIsRefused) {
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-train " + dir(), &out), 2) << out;
  EXPECT_TRUE(contains(out, dir() + ": is a directory")) << out;
  EXPECT_FALSE(contains(out, "step ")) << out;
}

TEST_F(Reliability, CrOnlyLineEndingsAreRefusedAndCrlfReadsAsLf) {
  write_text(dir() + "/cr.in", "# a deck from an old Mac\rdim = 32\rnum_steps = 1\r");
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-train " + dir() + "/cr.in", &out), 2) << out;
  EXPECT_TRUE(contains(out, dir() + "/cr.in:1: a carriage return")) << out;
  const auto lf = kqlora::parse_deck_text("dim = 32\nnum_linears = 2\n", "lf", {}, 1, false);
  const auto crlf =
      kqlora::parse_deck_text("dim = 32\r\nnum_linears = 2\r\n", "crlf", {}, 1, false);
  EXPECT_EQ(crlf.to_deck_text(), lf.to_deck_text());
  EXPECT_EQ(crlf.num_linears, 2);
  EXPECT_TRUE(contains(
      input_error([] { kqlora::parse_deck_text(std::string("dim = 32\n\0", 10), "nul", {}); }),
      "nul: contains a NUL byte"));
}

TEST_F(Reliability, OverridesThatWouldNotReadBackAreRefused) {
  for (const std::string o : {"save_dir=a#b", "save_dir=a\nb", "metrics_file=x\ry"}) {
    const std::string what = input_error([&] { kqlora::parse_deck_text("", "t", {o}, 1, false); });
    EXPECT_TRUE(contains(what, "argument")) << what;
  }
  std::string out;
  EXPECT_EQ(run(train_cmd("num_steps=1 'save_dir=" + dir() + "/a#b'"), &out), 2) << out;
  EXPECT_TRUE(contains(out, "cannot contain '#'")) << out;
  EXPECT_FALSE(exists(dir() + "/a"));
  // What is accepted reads back as itself: the stored configuration parses to the same.
  const auto c = kqlora::parse_deck_text("", "t", {"save_dir= a b=c ", "seed=7"}, 1, false);
  EXPECT_EQ(c.save_dir, "a b=c");
  const auto back = kqlora::parse_deck_text(c.to_deck_text(), "echo", {}, 1, false);
  EXPECT_EQ(back.to_deck_text(), c.to_deck_text());
}

TEST_F(Reliability, SizesThatOverflowAreRefused) {
  // dim = 2^32: dim x dim wrapped to 0, a multiple of every block size.
  const std::string huge =
      input_error([] { kqlora::parse_deck_text("", "t", {"dim=4294967296"}, 1, false); });
  EXPECT_TRUE(contains(huge, "4294967296 x 4294967296 is too large")) << huge;
  kqlora::Nf4Layout L;
  L.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_TRUE(contains(input_error([&] { (void)L.numel(); }), "too many elements"));
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-bench --sizes 4294967296 --filter none", &out), 2) << out;
  EXPECT_TRUE(contains(out, "--sizes")) << out;
  // checked_mul against 128-bit products, near the bound and far beyond it.
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const int64_t a = static_cast<int64_t>(rng() >> (1 + rng() % 63)),
                  b = static_cast<int64_t>(rng() >> (1 + rng() % 63));
    const __int128 p = static_cast<__int128>(a) * b;
    if (p <= kqlora::kMaxElements)
      EXPECT_EQ(kqlora::checked_mul(a, b, "x"), static_cast<int64_t>(p));
    else
      EXPECT_THROW(kqlora::checked_mul(a, b, "x"), kqlora::InputError) << a << " x " << b;
  }
}

TEST_F(Reliability, QuantizeCopiesEmptyTensorsAndWidensFloat16) {
  const std::string in = dir() + "/in.safetensors", out_h5 = dir() + "/out.h5";
  const auto w = nf4test::randn(64 * 64, 5);
  kqlora::safetensors::write(
      in, {{"empty", "F32", {0, 64}, nullptr, 0}, {"w", "F32", {64, 64}, w.data(), 4 * w.size()}});
  std::string out;
  ASSERT_EQ(run(bin + "/kqlora-quantize " + in + " " + out_h5, &out), 0) << out;
  EXPECT_TRUE(contains(out, "copied as float (empty)")) << out;
  {
    auto f = kqlora::h5::open_file(out_h5);
    auto params = kqlora::h5::open_group(f, "params");
    EXPECT_EQ(kqlora::h5::dataset_dims(params, "empty", out_h5), (std::vector<int64_t>{0, 64}));
    EXPECT_TRUE(kqlora::h5::is_nf4_group(params, "w"));
  }
  // HDF5 float16 (5 exponent bits) is not bfloat16: it widens to float32 NF4 (docs/NF4.md),
  // the bytes of quantizing the widened values.
  const std::string h16 = dir() + "/half.h5", out16 = dir() + "/half_nf4.h5";
  std::vector<uint16_t> half(64 * 64);
  std::vector<float> widened(half.size());
  for (size_t i = 0; i < half.size(); ++i) {
    half[i] = static_cast<uint16_t>(0x3000 + (i * 37) % 0x1800);  // normals in [2^-3, 2^3)
    if (i % 3 == 0) half[i] |= 0x8000;
    widened[i] = kqlora::half_to_float(half[i]);
  }
  {
    auto f = kqlora::h5::create_file(h16);
    kqlora::h5::Handle type(KQLORA_H5(H5Tcopy(H5T_IEEE_F32LE)));
    KQLORA_H5(H5Tset_fields(type, 15, 10, 5, 0, 10));
    KQLORA_H5(H5Tset_size(type, 2));
    KQLORA_H5(H5Tset_ebias(type, 15));
    kqlora::h5::write_dataset(f, "w", type, type, {64, 64}, half.data());  // the bits as they are
    f.close();
  }
  ASSERT_EQ(run(bin + "/kqlora-quantize " + h16 + " " + out16, &out), 0) << out;
  auto f = kqlora::h5::open_file(out16);
  auto params = kqlora::h5::open_group(f, "params");
  const auto got = kqlora::h5::read_nf4(params, "w", out16);
  EXPECT_EQ(got.layout.dtype, kqlora::DType::float32);
  kqlora::Nf4Layout L;
  L.shape = {64, 64};
  const auto want = nf4test::quantize(widened, L);
  EXPECT_EQ(nf4test::to_host(got.quantized_data), nf4test::to_host(want.quantized_data));
}

TEST_F(Reliability, QuantizeIntoADirectoryLeavesNothing) {
  const std::string in = dir() + "/in.safetensors", out_dir = dir() + "/existing";
  const auto w = nf4test::randn(64 * 64, 5);
  kqlora::safetensors::write(in, {{"w", "F32", {64, 64}, w.data(), 4 * w.size()}});
  ASSERT_EQ(::mkdir(out_dir.c_str(), 0755), 0);
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-quantize " + in + " " + out_dir, &out), 2) << out;
  EXPECT_TRUE(contains(out, out_dir)) << out;
  EXPECT_FALSE(exists(out_dir + ".tmp"));
}

TEST_F(Reliability, TensorNamesThatAreNotNamesAreRefused) {
  const float v[64] = {1.0f};
  for (const std::string name : {"/abs", "a/", "", ".", ".."}) {
    const std::string in = dir() + "/names.safetensors", out_h5 = dir() + "/names.h5";
    kqlora::safetensors::write(in, {{name, "F32", {64}, v, sizeof v}});
    std::string out;
    EXPECT_EQ(run(bin + "/kqlora-quantize " + in + " " + out_h5, &out), 2) << name << ": " << out;
    EXPECT_TRUE(contains(out, in)) << out;
    EXPECT_FALSE(exists(out_h5)) << name;
  }
}

TEST_F(Reliability, DirectoryAsATensorFileOrInitFileIsRefused) {
  const std::string d = dir() + "/adir";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  EXPECT_TRUE(
      contains(input_error([&] { kqlora::safetensors::read_header(d); }), d + ": is a directory"));
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-quantize " + d + " " + dir() + "/o.h5", &out), 2) << out;
  EXPECT_TRUE(contains(out, "is a directory")) << out;
  EXPECT_EQ(run(train_cmd("num_steps=1 init_file=" + d + " save_dir=" + dir() + "/ck"), &out), 2)
      << out;
  EXPECT_TRUE(contains(out, d)) << out;
}

TEST_F(Reliability, LatestThatIsDamagedOrDanglingIsReported) {
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 save_dir=" + dir() + "/ck"), log);
  const std::string latest = dir() + "/ck/latest";
  std::string out;
  ASSERT_EQ(run(bin + "/kqlora-diff " + dir() + "/ck " + dir() + "/ck", &out), 0) << out;
  write_text(latest, std::string("step-00000001\0junk", 18));
  EXPECT_EQ(run(bin + "/kqlora-diff " + dir() + "/ck " + dir() + "/ck", &out), 2) << out;
  EXPECT_TRUE(contains(out, "step-00000001\\x00junk")) << out;
  ASSERT_EQ(::unlink(latest.c_str()), 0);
  ASSERT_EQ(::symlink("step-99999999-gone", latest.c_str()), 0);
  EXPECT_EQ(run(bin + "/kqlora-diff " + dir() + "/ck " + dir() + "/ck", &out), 2) << out;
  EXPECT_TRUE(contains(out, latest)) << out;
  EXPECT_FALSE(contains(out, "no checkpoint files")) << out;
  EXPECT_TRUE(contains(input_error([&] {
                         std::ostringstream l;
                         kqlora::train(deck("num_steps=2 restart=latest save_dir=" + dir() + "/ck"),
                                       l);
                       }),
                       latest));
}

namespace {

// A copy of the step-1 checkpoint file, changed by `damage` through the HDF5 API; kqlora-diff
// against the good one and a restart from it must both refuse it, naming the file and `what`.
void expect_damage_refused(const std::string& name, const std::function<void(hid_t)>& damage,
                           const std::string& what) {
  const std::string good = dir() + "/ck/step-00000001/rank-00000.h5";
  const std::string path = dir() + "/" + name + ".h5";
  ASSERT_EQ(std::system(("cp " + good + " " + path).c_str()), 0);
  {
    auto f = kqlora::h5::open_file(path, true);
    damage(f);
    f.close();
  }
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-diff " + good + " " + path, &out), 2) << name << ": " << out;
  EXPECT_TRUE(contains(out, path) && contains(out, what)) << name << ": " << out;
  const std::string e = input_error([&] {
    std::ostringstream l;
    kqlora::train(deck("num_steps=2 restart=" + path + " save_dir=" + dir() + "/never"), l);
  });
  EXPECT_TRUE(contains(e, path) && contains(e, what)) << name << ": " << e;
}

}  // namespace

TEST_F(Reliability, EveryObjectARestartReadsIsValidated) {
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 optimizer=adam save_dir=" + dir() + "/ck"), log);
  using kqlora::h5::write_dataset;
  expect_damage_refused(
      "seed_float64",
      [](hid_t f) {
        KQLORA_H5(H5Ldelete(f, "rng/seed", H5P_DEFAULT));
        const double s = 42;
        write_dataset(f, "rng/seed", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {1}, &s);
      },
      "/rng/seed");
  expect_damage_refused(
      "seed_value",
      [](hid_t f) {
        KQLORA_H5(H5Ldelete(f, "rng/seed", H5P_DEFAULT));
        const int64_t s = 42 ^ 0x100;
        write_dataset(f, "rng/seed", H5T_STD_I64LE, H5T_NATIVE_INT64, {1}, &s);
      },
      "/rng/seed");
  expect_damage_refused(
      "next_step",
      [](hid_t f) {
        KQLORA_H5(H5Ldelete(f, "data/next_step", H5P_DEFAULT));
        const int64_t s = 1 ^ 0x40;
        write_dataset(f, "data/next_step", H5T_STD_I64LE, H5T_NATIVE_INT64, {1}, &s);
      },
      "/data/next_step");
  expect_damage_refused(
      "empty_step",
      [](hid_t f) {
        KQLORA_H5(H5Adelete(f, "step"));
        kqlora::h5::write_attribute(f, "step", std::vector<int64_t>{});
      },
      "attribute 'step' holds 0 integers");
  expect_damage_refused(  // declared far larger than memory: refused before any allocation
      "huge_shape",
      [](hid_t f) {
        KQLORA_H5(H5Ldelete(f, "params/layers.0.lora_a.weight", H5P_DEFAULT));
        kqlora::h5::create_checkpoint_dataset(f, "params/layers.0.lora_a.weight", H5T_IEEE_F32LE,
                                              {int64_t{1} << 30, int64_t{1} << 16}, false);
      },
      "more than the config's");
  expect_damage_refused(
      "optimizer_shape",
      [](hid_t f) {
        KQLORA_H5(H5Ldelete(f, "optimizer/layers.0.lora_a.weight/exp_avg", H5P_DEFAULT));
        std::vector<float> v(100, 0.5f);
        kqlora::h5::write_float(f, "optimizer/layers.0.lora_a.weight/exp_avg", {100}, v.data());
      },
      "/optimizer/layers.0.lora_a.weight/exp_avg has 100 elements");
}

TEST(InputFileScope, HdfFailuresWhileReadingNameTheFile) {
  const std::string path = dir() + "/scope.h5";
  ASSERT_EQ(std::system(("mkdir -p " + dir()).c_str()), 0);
  kqlora::h5::create_file(path).close();
  auto f = kqlora::h5::open_file(path);
  try {
    kqlora::h5::InputFileScope scope(path);
    KQLORA_H5(H5Gopen2(f, "missing", H5P_DEFAULT));
    ADD_FAILURE() << "opened a missing group";
  } catch (const kqlora::InputError& e) {
    EXPECT_TRUE(contains(e.what(), path + ": damaged or not a file kqlora wrote")) << e.what();
  }
  try {  // outside a scope: a failure of the system or of kqlora, not the user's input
    KQLORA_H5(H5Gopen2(f, "missing", H5P_DEFAULT));
    ADD_FAILURE() << "opened a missing group";
  } catch (const kqlora::InputError& e) {
    ADD_FAILURE() << e.what();
  } catch (const kqlora::Error& e) {
    EXPECT_TRUE(contains(e.what(), "H5Gopen2")) << e.what();
  }
}

TEST_F(Reliability, SaveDirThatCannotBeWrittenIsReportedBeforeTheFirstStep) {
  write_text(dir() + "/a_file", "x");
  std::string out;
  EXPECT_EQ(run(train_cmd("num_steps=2 save_dir=" + dir() + "/a_file/ck"), &out), 2) << out;
  EXPECT_TRUE(contains(out, dir() + "/a_file")) << out;
  EXPECT_FALSE(contains(out, "step      1/")) << out;
}

namespace {

// `good` rewritten in HDF5's older file format (no metadata checksums), as kqlora wrote
// checkpoints before format_version 2: objects copied by HDF5, root attributes byte for byte.
void copy_to_old_format(const std::string& good, const std::string& old, int64_t version) {
  auto src = kqlora::h5::open_file(good);
  kqlora::h5::Handle dst(
      KQLORA_H5(H5Fcreate(old.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
  for (const char* group : {"params", "optimizer", "rng", "data"})
    KQLORA_H5(H5Ocopy(src, group, dst, group, H5P_DEFAULT, H5P_DEFAULT));
  H5O_info_t info;
  KQLORA_H5(H5Oget_info2(src, &info, H5O_INFO_NUM_ATTRS));
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    kqlora::h5::Handle a(KQLORA_H5(
        H5Aopen_by_idx(src, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT)));
    char name[256];
    KQLORA_H5(H5Aget_name(a, sizeof name, name));
    if (std::string(name) == "format_version") continue;
    kqlora::h5::Handle type(KQLORA_H5(H5Aget_type(a))), space(KQLORA_H5(H5Aget_space(a)));
    std::vector<char> bytes(H5Tget_size(type) *
                            static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    KQLORA_H5(H5Aread(a, type, bytes.data()));
    kqlora::h5::Handle b(KQLORA_H5(H5Acreate2(dst, name, type, space, H5P_DEFAULT, H5P_DEFAULT)));
    KQLORA_H5(H5Awrite(b, type, bytes.data()));
  }
  kqlora::h5::write_attribute(dst, "format_version", version);
  dst.close();
}

}  // namespace

TEST_F(Reliability, VersionOneFilesLoadWithAWarningAndVersionTwoIsChecksummed) {
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 optimizer=adam save_dir=" + dir() + "/ck"), log);
  const std::string good = dir() + "/ck/step-00000001/rank-00000.h5";
  {
    auto f = kqlora::h5::open_file(good);
    EXPECT_TRUE(kqlora::h5::metadata_checksummed(f));
    EXPECT_EQ(kqlora::h5::read_int64_attribute(f, "format_version", good), 2);
  }
  const std::string v1 = dir() + "/v1.h5", fake = dir() + "/v2_unchecksummed.h5";
  copy_to_old_format(good, v1, 1);
  copy_to_old_format(good, fake, 2);
  {
    auto f = kqlora::h5::open_file(v1);
    EXPECT_FALSE(kqlora::h5::metadata_checksummed(f));
  }
  std::string out;
  EXPECT_EQ(run(bin + "/kqlora-diff " + good + " " + v1 + " --rtol 0 --atol 0 --optimizer", &out),
            0)
      << out;
  EXPECT_TRUE(contains(out, "warning: " + v1 + ": format_version 1")) << out;
  std::ostringstream resumed;
  kqlora::train(deck("num_steps=2 optimizer=adam restart=" + v1 + " save_dir=" + dir() + "/r"),
                resumed);
  EXPECT_TRUE(contains(resumed.str(), "format_version 1")) << resumed.str();
  EXPECT_EQ(run(bin + "/kqlora-diff " + good + " " + fake, &out), 2) << out;
  EXPECT_TRUE(contains(out, fake + ": format_version 2, but its HDF5 metadata is not checksummed"))
      << out;
}

TEST_F(Reliability, RunsThatCannotFitAreRefusedBeforeTheFirstAllocation) {
  // 3e9 layers of dim 64: refused at once (at 35d580f it ran until the kernel killed it).
  std::string out;
  EXPECT_EQ(run(train_cmd("num_linears=3000000000 num_steps=1 save_dir=" + dir() + "/ck"), &out), 2)
      << out;
  EXPECT_TRUE(contains(out, "does not fit in memory (dim, num_linears, lora_rank, micro_bs"))
      << out;
  EXPECT_TRUE(contains(out, "memory_check = off")) << out;
  // The estimate's parts, against the sizes they count (float32, Adam: two moments).
  const auto c = deck("num_linears=3 num_steps=1");
  const auto e = kqlora::estimate_memory(c, 1, 1, 0);
  std::map<std::string, int64_t> part(e.parts.begin(), e.parts.end());
  const int64_t trainable = 3 * 2 * 64 * 4;  // lora_a [4, 64] and lora_b [64, 4] per layer
  EXPECT_EQ(part["trainable parameters and gradients"], 8 * trainable);
  EXPECT_EQ(part["optimizer state"], 8 * trainable);
  EXPECT_EQ(part["frozen NF4 base"], 3 * 64 * 64 / 2 + 3 * 64 * 64 / 64 + 4 * (3 * 64 / 256 + 1));
  // FSDP shards the base and the optimizer state.
  const auto f = kqlora::estimate_memory(deck("num_linears=3 parallel=fsdp global_bs=4"), 4, 4, 0);
  std::map<std::string, int64_t> fpart(f.parts.begin(), f.parts.end());
  EXPECT_EQ(fpart["optimizer state"], 8 * trainable / 4);
  EXPECT_EQ(fpart["frozen NF4 base"], part["frozen NF4 base"] / 4);
  // Set-up holds the whole base on every rank before FSDP shards it (and one weight's
  // float32 values): its excess over training is at least the other ranks' shards.
  int64_t ftraining = 0;
  for (const auto& p : f.parts)
    if (p.first != "set-up's excess over training" && p.first != "untracked (libraries, packing)")
      ftraining += p.second;
  const int64_t fsetup = part["frozen NF4 base"] + 4 * 64 * 64 + 16 * trainable +
                         fpart["data_file and eval_file (read whole)"];
  EXPECT_EQ(fpart["set-up's excess over training"], std::max<int64_t>(0, fsetup - ftraining));
  // The untracked allowance: an eighth of the larger phase and 64 MiB.
  int64_t tracked_parts = 0;
  for (const auto& p : e.parts)
    if (p.first != "untracked (libraries, packing)") tracked_parts += p.second;
  EXPECT_EQ(part["untracked (libraries, packing)"], tracked_parts / 8 + (int64_t(64) << 20));
  EXPECT_EQ(e.per_rank, tracked_parts + part["untracked (libraries, packing)"]);
  // Node-shared DDP: every rank maps the whole of the trainable weights, one copy per node;
  // the check counts it once per node. The base is each rank's own.
  const auto n = kqlora::estimate_memory(deck("num_linears=3 global_bs=4"), 4, 4, 0);
  std::map<std::string, int64_t> npart(n.parts.begin(), n.parts.end());
  EXPECT_EQ(npart["frozen NF4 base"], part["frozen NF4 base"]);
  EXPECT_EQ(n.node_shared, 4 * trainable - 4 * trainable / 4);
  // A budget below the estimate refuses the run; memory_check = off runs it; --dry-run
  // prints the configuration and the estimate and trains nothing.
  const std::string limit = "KQLORA_MEMORY_LIMIT=" + std::to_string(e.per_rank / 2) + " ";
  EXPECT_EQ(run(limit + train_cmd("num_linears=3 num_steps=1 save_dir=" + dir() + "/a"), &out), 2)
      << out;
  EXPECT_TRUE(contains(out, "KQLORA_MEMORY_LIMIT")) << out;
  EXPECT_EQ(
      run(limit + train_cmd("num_linears=3 num_steps=1 memory_check=off save_dir=" + dir() + "/b"),
          &out),
      0)
      << out;
  EXPECT_EQ(run(bin + "/kqlora-train --dry-run " + dir() + "/empty.in" + small +
                    " num_linears=3 save_dir=" + dir() + "/c",
                &out),
            0)
      << out;
  EXPECT_TRUE(contains(out, "num_linears = 3") && contains(out, "memory estimate per rank")) << out;
  EXPECT_FALSE(contains(out, "step ")) << out;
  EXPECT_FALSE(exists(dir() + "/c"));
}

TEST_F(Reliability, ADeviceRunIsCheckedAgainstItsGpusFreeMemoryShared) {
  // The model's tensors, optimizer state and activations are budgeted against the GPU's free
  // memory, split among the ranks on it; the host keeps the table, data and staging.
  const auto c = deck("num_linears=3 num_steps=1 global_bs=4");
  const auto h = kqlora::estimate_memory(c, 4, 4, 0);
  kqlora::MemoryPlacement gpu;
  gpu.device = true;
  gpu.ranks_per_device = 2;
  gpu.device_free = {int64_t(10) << 30, "test GPU 10.0 GiB"};
  gpu.nccl = true;
  gpu.device_collectives = true;
  const auto d = kqlora::estimate_memory(c, 4, 4, 0, gpu);
  std::map<std::string, int64_t> host(h.parts.begin(), h.parts.end()),
      dhost(d.parts.begin(), d.parts.end()), dev(d.device_parts.begin(), d.device_parts.end());
  EXPECT_TRUE(h.device_parts.empty());
  EXPECT_EQ(h.device_per_rank, 0);
  for (const char* part :
       {"frozen NF4 base", "trainable parameters and gradients", "optimizer state"}) {
    EXPECT_EQ(dev[part], host[part]) << part;
    EXPECT_EQ(dhost.count(part), 0u) << part;
  }
  EXPECT_EQ(dhost["the parameter table"], host["the parameter table"]);
  EXPECT_EQ(dev["CUDA libraries (cuBLAS workspace, NCCL staging)"],
            (int64_t(64) << 20) + kqlora::kNcclStagingBytes);
  // Node-shared DDP maps host memory: not a device run's.
  EXPECT_GT(h.node_shared, 0);
  EXPECT_EQ(d.node_shared, 0);
  int64_t device_sum = 0;
  for (const auto& p : d.device_parts) device_sum += p.second;
  EXPECT_EQ(d.device_per_rank, device_sum);
  EXPECT_EQ(d.device_budget_per_rank, static_cast<int64_t>(0.9 * double(int64_t(10) << 30) / 2));
  EXPECT_NE(d.report().find("rank(s) on this GPU"), std::string::npos) << d.report();
  // Without device collectives DDP stages its gradients in host memory.
  gpu.device_collectives = false;
  const auto staged = kqlora::estimate_memory(c, 4, 4, 0, gpu);
  std::map<std::string, int64_t> shost(staged.parts.begin(), staged.parts.end());
  const int64_t trainable = 3 * 2 * 64 * 4;
  EXPECT_EQ(shost["host staging (set-up reads, collectives)"] -
                dhost["host staging (set-up reads, collectives)"],
            4 * trainable);
  // A GPU too small refuses the run naming GPU memory; memory_check = off runs it.
  gpu.device_free = {d.device_per_rank, "test GPU"};
  try {
    kqlora::check_memory(c, 4, 4, 0, "deck.in", gpu);
    ADD_FAILURE() << "a GPU of 0.9x the estimate was accepted";
  } catch (const kqlora::InputError& err) {
    EXPECT_NE(std::string(err.what()).find("does not fit in GPU memory"), std::string::npos)
        << err.what();
  }
  gpu.device_free = {2 * d.device_per_rank * gpu.ranks_per_device, "test GPU"};
  EXPECT_NO_THROW(kqlora::check_memory(c, 4, 4, 0, "deck.in", gpu));
  gpu.device_free = {1, "test GPU"};
  EXPECT_NO_THROW(kqlora::check_memory(deck("num_linears=3 memory_check=off"), 1, 1, 0, "d", gpu));
  // FSDP's padded vectors sit beside the model on the GPU; without device collectives
  // they and a gathered weight are staged on the host as well.
  const auto fc = deck("num_linears=3 num_steps=1 global_bs=4 parallel=fsdp");
  gpu.device_free = {int64_t(10) << 30, "test GPU"};
  gpu.device_collectives = true;
  const auto fd = kqlora::estimate_memory(fc, 4, 4, 0, gpu);
  gpu.device_collectives = false;
  const auto fs = kqlora::estimate_memory(fc, 4, 4, 0, gpu);
  std::map<std::string, int64_t> fdev(fd.device_parts.begin(), fd.device_parts.end()),
      fdh(fd.parts.begin(), fd.parts.end()), fsh(fs.parts.begin(), fs.parts.end());
  const int64_t padded = 2 * 4 * trainable + 4 * trainable / 4;
  EXPECT_EQ(fdev["FSDP's padded parameters and gradients"], padded);
  EXPECT_EQ(fsh["host staging (set-up reads, collectives)"] -
                fdh["host staging (set-up reads, collectives)"],
            padded + 2 * (64 * 64 / 2 + 64 * 64 / 64));
  // This build's placement: host memory (no CUDA here), and the GPU memory hook.
  EXPECT_FALSE(kqlora::build_placement(1, false, false).device);
  EXPECT_EQ(kqlora::gpu_free_memory(0).bytes, 0);
  setenv("KQLORA_GPU_MEMORY_LIMIT", "123456789", 1);
  EXPECT_EQ(kqlora::gpu_free_memory(0).bytes, 123456789);
  setenv("KQLORA_GPU_MEMORY_LIMIT", "16G", 1);  // (not bytes: refused, not read as 16)
  EXPECT_THROW(kqlora::gpu_free_memory(0), kqlora::InputError);
  unsetenv("KQLORA_GPU_MEMORY_LIMIT");
}

namespace {

/// A data file of `rows` x `dim` inputs and targets, in HDF5's older format (h5py's default)
/// or its checksummed 1.10 format.
void write_data_file(const std::string& path, int64_t rows, int64_t dim, bool checksummed) {
  kqlora::h5::Handle fapl(KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS)));
  if (checksummed) kqlora::h5::set_checksummed_format(fapl);
  kqlora::h5::Handle f(KQLORA_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)));
  std::vector<float> v(static_cast<size_t>(rows * dim));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
  const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(dim)};
  for (const char* name : {"inputs", "targets"}) {
    kqlora::h5::Handle space(KQLORA_H5(H5Screate_simple(2, dims, nullptr)));
    kqlora::h5::Handle d(KQLORA_H5(
        H5Dcreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    KQLORA_H5(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  }
}

}  // namespace

// HDF5 1.10.8 decodes unchecksummed metadata as it finds it (docs/RELIABILITY.md, upstream
// limitations): a data or eval file in the older format trains, with a note that its
// damage cannot be detected and how to rewrite it; a checksummed one gets no note.
TEST_F(Reliability, DataFilesWithoutChecksummedMetadataAreNoted) {
  const std::string old_format = dir() + "/old.h5", checksummed = dir() + "/new.h5";
  write_data_file(old_format, 4, 64, false);
  write_data_file(checksummed, 4, 64, true);
  for (const auto& [path, noted] : {std::pair<std::string, bool>{old_format, true},
                                    std::pair<std::string, bool>{checksummed, false}}) {
    std::ostringstream log;
    const auto summary = kqlora::train(
        deck("num_steps=1 eval_every=1 loss=mse data_file=" + path + " eval_file=" + path), log);
    EXPECT_EQ(summary.steps_done, 1);
    const std::string note = "note: " + path + ": HDF5 metadata not checksummed";
    const std::string text = log.str();
    const size_t first = text.find(note);
    EXPECT_EQ(first != std::string::npos, noted) << text;
    if (noted) {  // once for data_file, once for eval_file, with the conversion
      EXPECT_NE(text.find(note, first + 1), std::string::npos) << text;
      EXPECT_TRUE(contains(text, "h5repack --low=2 --high=2")) << text;
    }
  }
}
