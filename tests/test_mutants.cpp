// Seeded byte edits of a small checkpoint (docs/RELIABILITY.md): every mutant is either
// read back with values identical to the original (kqlora-diff exit 0 at rtol 0, atol 0,
// optimizer included: the byte was unused) or refused with exit 2 naming the file; never
// exit 1, never a signal or a hang; and a restart never accepts a mutant kqlora-diff
// refuses. The edits favour the file's first and last 4 KiB, where HDF5 keeps most of its
// metadata (superblock, object headers, chunk indexes), over its checksummed data.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/train/config.hpp"
#include "kqlora/train/trainer.hpp"

namespace {

const std::string bin = KQLORA_TEST_BIN_DIR;
std::string dir() {
  return bin + "/../tests/tmp_mutants";
}

kqlora::Config deck(const std::string& keys) {
  std::vector<std::string> k;
  std::istringstream ss(
      "dim=64 num_linears=2 lora_rank=4 global_bs=2 optimizer=adam "
      "log_every=100 " +
      keys);
  for (std::string w; ss >> w;) k.push_back(w);
  return kqlora::parse_deck_text("", "test", k, 1);
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(Mutants, EveryByteEditIsReadIdenticallyOrRefusedNamingTheFile) {
  ASSERT_EQ(std::system(("rm -rf " + dir() + " && mkdir -p " + dir()).c_str()), 0);
  std::ostringstream log;
  kqlora::train(deck("num_steps=1 save_dir=" + dir() + "/ck"), log);
  const std::string good = dir() + "/ck/step-00000001/rank-00000.h5";
  const std::string bytes = read_all(good);
  ASSERT_GT(bytes.size(), 8192u);
  const char* env = std::getenv("KQLORA_MUTANTS");
  const int count = env ? std::atoi(env) : 300;
  std::mt19937_64 rng(14);
  int same = 0, refused = 0;
  for (int i = 0; i < count; ++i) {
    const size_t n = bytes.size();
    size_t pos = rng() % n;
    if (i % 3 == 0) pos = rng() % 4096;
    if (i % 3 == 1) pos = n - 1 - rng() % 4096;
    const unsigned char flip = static_cast<unsigned char>(1 + rng() % 255);
    std::string m = bytes;
    m[pos] = static_cast<char>(static_cast<unsigned char>(m[pos]) ^ flip);
    const std::string path = dir() + "/mutant.h5", out = dir() + "/diff.log";
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(m.data(), m.size());
    const int status = std::system(("timeout 60 " + bin + "/kqlora-diff " + good + " " + path +
                                    " --rtol 0 --atol 0 --optimizer > " + out + " 2>&1")
                                       .c_str());
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const std::string text = read_all(out);
    const std::string what = "mutant " + std::to_string(i) + " (byte " + std::to_string(pos) +
                             " ^ " + std::to_string(flip) + "): ";
    ASSERT_TRUE(rc == 0 || rc == 2) << what << "exit code " << rc << "\n" << text;
    if (rc == 0) {
      ++same;
      continue;
    }
    ++refused;
    EXPECT_NE(text.find(path), std::string::npos) << what << text;
    try {
      std::ostringstream l;
      kqlora::train(deck("num_steps=2 restart=" + path + " save_dir=" + dir() + "/never"), l);
      ADD_FAILURE() << what << "a restart accepted what kqlora-diff refused:\n" << text;
    } catch (const kqlora::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << what << e.what();
    }
  }
  std::cout << count << " mutants of a " << bytes.size() << "-byte checkpoint: " << same
            << " read back identical, " << refused << " refused (exit 2)\n";
  EXPECT_GT(refused, count / 10);  // the edits do reach what is read
}
