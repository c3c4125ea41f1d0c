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
/// where built). Throws InputError for another value, or onednn in a build without it.
void select_gemm_engine();

/// One line for logs and --version, e.g. "oneDNN 2.6.3 (OpenMP runtime, threads as the
/// BLAS's); KQLORA_GEMM unset".
std::string describe_gemm_engine();

namespace impl {

/// Row-major C [m, n] = alpha op(A) op(B) + beta C through oneDNN, with as many threads as
/// the BLAS has (blas_threads()); op "N" or "T" as ta / tb. Requires onednn_available().
void onednn_sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace impl
}  // namespace kqlora
