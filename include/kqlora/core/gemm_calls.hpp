#pragma once
// A count of the vendor GEMM calls this process has made: every product core/blas.hpp
// hands to cuBLAS, the host BLAS, oneDNN or Kokkos Kernels' gemm (a batched call counts
// once; products with an empty result, which call nothing, not at all). kqlora's own
// kernels (the fused NF4 GEMM, the fused attention) are not vendor calls. A relaxed atomic
// increment per call: it costs nothing next to a product, and it counts where no profiler
// (CUPTI, nsys) is there to ask. kqlora-bench reports it per step (docs/BENCHMARKS.md).

#include <cstdint>

namespace kqlora {

/// The vendor GEMM calls made so far (all threads).
uint64_t gemm_calls();

namespace impl {
/// Counts one vendor GEMM call (core/blas.hpp, just before the call).
void count_gemm_call() noexcept;
}  // namespace impl

}  // namespace kqlora
