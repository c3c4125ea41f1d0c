#include "bench_tensor_read.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/bit_cast.hpp"
#include "kqlora/io/safetensors.hpp"

namespace kqlora::bench {

namespace {

/// The read set-up did before the check (commit 56de5f9): pieces of 2^21 elements, bfloat16
/// widened by a shift, no look at the values (float32 read straight into place).
void plain_read(const safetensors::Header& h, const safetensors::TensorInfo& t, float* dst) {
  const int64_t n = t.numel();
  const bool bf16 = t.dtype == "BF16";
  std::ifstream f(h.path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(h.data_start + t.begin));
  constexpr int64_t kPiece = int64_t(1) << 21;
  std::vector<uint8_t> piece(static_cast<size_t>(std::min(n, kPiece) * 2));
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t m = std::min(kPiece, n - i0);
    if (!bf16) {
      f.read(reinterpret_cast<char*>(dst + i0), static_cast<std::streamsize>(4 * m));
      continue;
    }
    f.read(reinterpret_cast<char*>(piece.data()), static_cast<std::streamsize>(2 * m));
    for (int64_t i = 0; i < m; ++i) {
      uint16_t v;
      std::memcpy(&v, piece.data() + 2 * i, 2);
      dst[i0 + i] = bit_cast<float>(static_cast<uint32_t>(v) << 16);
    }
  }
}

}  // namespace

void tensor_read_records(int64_t n, int pairs, const std::string& filter,
                         std::vector<Record>& out) {
  for (const bool bf16 : {false, true}) {
    const std::string name =
        "tensor_read_" + std::to_string(n) + "x" + std::to_string(n) + (bf16 ? "_bf16" : "_f32");
    if (!wanted(name, filter)) continue;
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kqlora_bench_read_" +
                             std::to_string(::getpid()) + ".safetensors";
    std::vector<float> values(static_cast<size_t>(n * n));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (auto& v : values) v = normal(rng);
    std::vector<uint16_t> halves;
    std::vector<safetensors::TensorToWrite> t;
    if (bf16) {
      halves.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) halves[i] = bfloat16(values[i]).bits;
      t.push_back({"w", "BF16", {n, n}, halves.data(), 2 * halves.size()});
    } else {
      t.push_back({"w", "F32", {n, n}, values.data(), 4 * values.size()});
    }
    safetensors::write(path, t, {});
    const safetensors::Header h = safetensors::read_header(path);
    const safetensors::TensorInfo& info = *h.find("w");
    std::vector<float> dst(values.size());
    std::vector<double> checked, plain, ratio;
    safetensors::read_f32_into(h, info, dst.data());  // (warm-up: page cache, pages of dst)
    plain_read(h, info, dst.data());
    for (int p = 0; p < pairs; ++p) {
      checked.push_back(seconds([&] { safetensors::read_f32_into(h, info, dst.data()); }));
      plain.push_back(seconds([&] { plain_read(h, info, dst.data()); }));
      ratio.push_back(checked.back() / plain.back());
    }
    std::remove(path.c_str());
    const double bytes = static_cast<double>(n * n) * (bf16 ? 6 : 8);  // read + written
    Record c{name}, q{name + "_plain"};
    c.median_s = median(checked);
    q.median_s = median(plain);
    c.bytes = q.bytes = bytes;
    c.elements = q.elements = static_cast<double>(n * n);
    c.ratio_to_dense = median(ratio);
    out.push_back(c);
    out.push_back(q);
  }
}

}  // namespace kqlora::bench
