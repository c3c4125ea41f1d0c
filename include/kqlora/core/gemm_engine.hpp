#pragma once
// The engine of the host's float32 products (docs/BLAS.md, "The GEMM engine"): oneDNN's
// sgemm where kqlora was built with it (KQLORA_HAVE_ONEDNN), the BLAS otherwise. oneDNN's
// JIT kernels run the training step's shapes 5 - 50% faster than OpenBLAS 0.3.21 on
// AVX-512 (measured side by side, docs/BLAS.md). KQLORA_GEMM=blas or onednn chooses at
// run time; the choice is named in --version and on the first line of every log.

#include <cstdint>
#include <string>

namespace kqlora {

enum class GemmEngine { blas, onednn };

/// The engine host products use now (read on every product: cheap).
GemmEngine host_gemm_engine();

/// Chooses the engine (tests and benchmarks compare the two); onednn needs a oneDNN build.
void set_host_gemm_engine(GemmEngine engine);

/// Whether this build has oneDNN.
bool onednn_available();

/// Called by kqlora::Runtime: the engine from KQLORA_GEMM ("blas", "onednn"; unset: oneDNN
/// where built) and the bfloat16 products' from KQLORA_AMX ("on", "off"; unset: on where
/// available). Throws InputError for another value, or onednn in a build without it.
void select_gemm_engine();

/// Whether products of bfloat16 values (GemmInputs::bfloat16, core/blas.hpp) run on
/// bfloat16 hardware: the engine is oneDNN, oneDNN multiplies bfloat16 faster than float32
/// on this CPU (host_bf16_products_unit()) and KQLORA_AMX is not "off". The inputs are exact
/// there, products are summed in float32: the numbers differ from float32 products only in
/// the summation order (docs/BLAS.md, "bfloat16 products").
bool host_bf16_products();

/// Turns the bfloat16 products off or on (tests compare the two); on needs them
/// available (host_bf16_products_available()).
void set_host_bf16_products(bool on);

/// The bfloat16 hardware oneDNN multiplies on here, probed once: "AMX" (Intel Sapphire
/// Rapids and later), "AVX512_BF16" (AMD Zen 4 and later, whose bfloat16 dot product runs at
/// twice the float32 FMA rate), or "" (none that beats float32 products, or no oneDNN 2.x).
const std::string& host_bf16_products_unit();

/// Whether host_bf16_products_unit() names one.
inline bool host_bf16_products_available() {
  return !host_bf16_products_unit().empty();
}

/// One line for logs and --version, e.g. "oneDNN 2.6.3 (OpenMP runtime, threads as the
/// BLAS's); KQLORA_GEMM unset".
std::string describe_gemm_engine();

namespace impl {

/// While alive, oneDNN's OpenMP runtime runs as many threads as the BLAS (blas_threads());
/// the caller's OpenMP setting comes back after.
class OnednnThreads {
 public:
  OnednnThreads();
  ~OnednnThreads();
  OnednnThreads(const OnednnThreads&) = delete;
  OnednnThreads& operator=(const OnednnThreads&) = delete;

 private:
  int had_ = 0;  // the caller's thread count to restore; 0: nothing to restore
};

/// Row-major C [m, n] = alpha op(A) op(B) + beta C through oneDNN, with as many threads as
/// the BLAS has (blas_threads()); op "N" or "T" as ta / tb. Requires onednn_available().
void onednn_sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

/// The right operand of a bfloat16 product, row-major with row stride ld: float32 data
/// holding bfloat16 values (`f`), or their 16-bit bits (`bits`: a weight's 16-bit copy,
/// read in place), exactly one of the two.
struct Bf16Operand {
  const float* f = nullptr;
  const uint16_t* bits = nullptr;
  int64_t ld = 0;
};

/// Row-major C [m, n] = alpha op(A) op(B) + beta C on bfloat16 hardware (as onednn_sgemm's
/// arguments), A float32 data holding bfloat16 values. Requires host_bf16_products_available().
void onednn_bf16_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* A, int64_t lda, Bf16Operand B, float beta, float* C,
                      int64_t ldc);

/// As onednn_sgemm, with A and B holding bfloat16 values: narrowed to 16 bits (exactly;
/// other values are rounded to nearest even) and multiplied on bfloat16 hardware, summed in
/// float32. Requires host_bf16_products_available().
void onednn_bf16_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc);

}  // namespace impl
}  // namespace kqlora
