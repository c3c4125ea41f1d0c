// Products of bfloat16 values on bfloat16 hardware (AMX, or AVX512_BF16 on AMD) through
// oneDNN's matmul primitive (core/gemm_engine.hpp; docs/BLAS.md, "bfloat16 products").
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kqlora/build_config.hpp"
#include "kqlora/core/bfloat16.hpp"
#include "kqlora/core/cpu_features.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/gemm_engine.hpp"

#if KQLORA_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

// Written for oneDNN 2.x's matmul API (Debian 12 has 2.6); 3.x dropped the operation
// descriptors and output scales it uses, so with 3.x bfloat16 products stay float32.
#if KQLORA_HAVE_ONEDNN && DNNL_VERSION_MAJOR < 3
#define KQLORA_AMX_PRODUCTS 1
#else
#define KQLORA_AMX_PRODUCTS 0
#endif

namespace kqlora {

#if KQLORA_AMX_PRODUCTS
namespace {

using dnnl::memory;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

/// op(X) [rows, cols] over 16-bit data stored row-major with row stride ld: [rows, cols]
/// or, with `t`, the transpose of [cols, rows].
memory::desc bf16_operand(int64_t rows, int64_t cols, bool t, int64_t ld) {
  return memory::desc({rows, cols}, memory::data_type::bf16,
                      t ? memory::dims{1, ld} : memory::dims{ld, 1});
}

/// The matmul primitive of one product shape, made once (making one costs tens of
/// microseconds: more than a small product).
struct Product {
  dnnl::matmul prim;
  memory::desc a, b, c;
};

using ProductKey =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

Product make_product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                     int64_t ldc, float alpha, float beta) {
  Product p;
  p.a = bf16_operand(m, k, ta, lda);
  p.b = bf16_operand(k, n, tb, ldb);
  p.c = memory::desc({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, cpu_engine());
  p.prim = dnnl::matmul(pd);
  return p;
}

/// Primitives kept per thread at most: a run whose micro-batches are trimmed to their
/// longest row meets new row counts step after step, and each primitive holds its JIT
/// code; when full the cache starts again (a run's steady shapes are a few dozen).
constexpr size_t kMaxProducts = 2048;

const Product& product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                       int64_t ldc, float alpha, float beta) {
  // One cache per thread: primitives are not shared across threads that may run at once.
  thread_local std::map<ProductKey, std::unique_ptr<Product>> cache;
  const ProductKey key{ta, tb, m, n, k, lda, ldb, ldc, alpha, beta};
  auto it = cache.find(key);
  if (it == cache.end() && cache.size() >= kMaxProducts) cache.clear();
  if (it == cache.end())
    it = cache
             .emplace(key, std::make_unique<Product>(
                               make_product(ta, tb, m, n, k, lda, ldb, ldc, alpha, beta)))
             .first;
  return *it->second;
}

/// dst [rows, cols] (packed) = the bfloat16 bits of src [rows, cols] (row stride ld).
void narrow(const float* src, int64_t ld, int64_t rows, int64_t cols, uint16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst + r * cols;
    for (int64_t c = 0; c < cols; ++c) d[c] = bfloat16::round_bits(s[c]);
  }
}

/// The 16-bit copies of the operands are bounded, so that no product holds a copy the
/// size of its largest operand (an LM head's weight): products over a longer summed index
/// run in blocks of it (docs/BLAS.md). B's copy is 4 MiB at most; A's 16 MiB, since
/// oneDNN packs B again for every block of A's rows (an LM head's backward, 256 x 49152 x
/// 576 over the head's 16-bit copy, ran 1.6x slower in 42-row blocks than in one); and a
/// 16-bit B is read in blocks of kBitsBlock of the summed index.
constexpr int64_t kBOperandBytes = int64_t(4) << 20;
constexpr int64_t kAOperandBytes = int64_t(16) << 20;
constexpr int64_t kBitsBlock = 8192;

}  // namespace

const std::string& host_bf16_products_unit() {
  static const std::string unit = []() -> std::string {
    try {
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(bf16_operand(64, 64, false, 64), bf16_operand(64, 64, false, 64),
                             memory::desc({64, 64}, memory::data_type::f32, {64, 1})),
          cpu_engine());
      const std::string impl = pd.impl_info_str();
      if (impl.find("amx") != std::string::npos) return "AMX";
      // AVX512_BF16's dot product runs at twice the float32 FMA rate on AMD (Zen 4), at
      // half of it on Intel's Xeons without AMX (docs/BLAS.md): used on AMD only.
      if (impl.find("avx512_core_bf16") != std::string::npos &&
          cpu_features().vendor == "AuthenticAMD")
        return "AVX512_BF16";
      return "";
    } catch (const dnnl::error&) {
      return "";
    }
  }();
  return unit;
}

namespace impl {

void onednn_bf16_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* A, int64_t lda, Bf16Operand B, float beta, float* C,
                      int64_t ldc) {
  KQLORA_CHECK(host_bf16_products_available(), "onednn_bf16_gemm: no bfloat16 products here");
  KQLORA_CHECK((B.f != nullptr) != (B.bits != nullptr),
               "onednn_bf16_gemm: B is float32 or 16-bit data");
  const bool tA = ta == 'T', tB = tb == 'T';
  if (m == 0 || n == 0) return;
  // The summed index in blocks (of a size that depends on k and n only, so that a row's
  // sums do not depend on how many rows a call has): kBitsBlock with a 16-bit B (read in
  // place), else what fits B's copy; rows in blocks whose A copy fits.
  const int64_t kb = B.bits ? std::min(k, kBitsBlock)
                            : std::min(k, std::max<int64_t>(64, kBOperandBytes / 2 / n / 64 * 64));
  const int64_t mb = std::min(m, std::max<int64_t>(1, kAOperandBytes / 2 / kb));
  thread_local std::vector<uint16_t> a16, b16;
  a16.resize(static_cast<size_t>(mb * kb));
  if (B.f) b16.resize(static_cast<size_t>(kb * n));
  const OnednnThreads threads;
  dnnl::stream stream(cpu_engine());
  try {
    for (int64_t k0 = 0; k0 < k; k0 += kb) {
      const int64_t kn = std::min(kb, k - k0);
      // op(B) rows k0 .. k0 + kn: stored rows of B, or its columns when transposed.
      const int64_t b_at = tB ? k0 : k0 * B.ld;
      const uint16_t* b = B.bits ? B.bits + b_at : b16.data();
      const int64_t ldb = B.bits ? B.ld : (tB ? kn : n);
      if (B.f) narrow(B.f + b_at, B.ld, tB ? n : kn, tB ? kn : n, b16.data());
      const float beta_k = k0 == 0 ? beta : 1.0f;
      for (int64_t i0 = 0; i0 < m; i0 += mb) {
        const int64_t mn = std::min(mb, m - i0);
        // op(A) rows i0 .. i0 + mn, summed index k0 .. k0 + kn, packed
        narrow(tA ? A + k0 * lda + i0 : A + i0 * lda + k0, lda, tA ? kn : mn, tA ? mn : kn,
               a16.data());
        const Product& p = product(tA, tB, mn, n, kn, tA ? mn : kn, ldb, ldc, alpha, beta_k);
        memory ma(p.a, cpu_engine(), a16.data()), mb16(p.b, cpu_engine(), const_cast<uint16_t*>(b)),
            mc(p.c, cpu_engine(), C + i0 * ldc);
        p.prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb16}, {DNNL_ARG_DST, mc}});
      }
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    KQLORA_CHECK(false, "oneDNN bfloat16 matmul (" << m << " x " << n << " x " << k
                                                   << ") failed: " << e.what());
  }
}

void onednn_bf16_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc) {
  onednn_bf16_gemm(ta, tb, m, n, k, alpha, A, lda, Bf16Operand{B, nullptr, ldb}, beta, C, ldc);
}

}  // namespace impl

#else  // without oneDNN 2.x

const std::string& host_bf16_products_unit() {
  static const std::string none;
  return none;
}

namespace impl {
void onednn_bf16_gemm(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                      Bf16Operand, float, float*, int64_t) {
  KQLORA_CHECK(false, "onednn_bf16_gemm: this kqlora was built without oneDNN 2.x");
}
void onednn_bf16_gemm(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                      const float*, int64_t, float, float*, int64_t) {
  KQLORA_CHECK(false, "onednn_bf16_gemm: this kqlora was built without oneDNN 2.x");
}
}  // namespace impl

#endif

}  // namespace kqlora
