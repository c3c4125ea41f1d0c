#pragma once
// Products with an NF4 weight W [out, in] whose dequantization is fused into the GEMM's
// packing (host, AVX-512): W is decoded straight into the small cache-resident panels the
// micro-kernel reads, so no float copy of W goes to memory and no BLAS packs it again. At a
// few hundred tokens those two passes over W cost as much as a fifth of the product
// (docs/BENCHMARKS.md, "The fused NF4 GEMM"). The values multiplied are nf4_decode's, bit
// for bit; only the order of the sums differs from a BLAS's.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>

#include "kqlora/quant/nf4_tensor.hpp"

namespace kqlora {

/// Which product with W: the linear's forward y = x W^T, or its input gradient gx = g W.
enum class Nf4GemmOp { forward, input_gradient };

namespace impl {

/// Whether this build has the fused host kernel for W's layout: AVX-512 compiled in
/// (KQLORA_NATIVE on such a CPU), float32 or bfloat16 NF4, block_size a multiple of 16
/// dividing 512 (the kernel's block of the summed index), in a multiple of block_size.
bool nf4_gemm_host_supports(const Nf4Layout& layout);

/// C = A op(W) + beta C on the host, A [rows, k] and C [rows, n] row-major with leading
/// dimensions lda and ldc (forward: k = in, n = out, op(W) = W^T; input gradient: k = out,
/// n = in, op(W) = W). `scratch` holds the packed A block (grown when too small).
/// `between` (if set) runs after each block of k, from the calling thread. Requires
/// nf4_gemm_host_supports(W.layout).
void nf4_gemm_host(const Kokkos::DefaultHostExecutionSpace& exec,
                   const Nf4Tensor<Kokkos::HostSpace>& W, Nf4GemmOp op, int64_t rows,
                   const float* A, int64_t lda, float beta, float* C, int64_t ldc,
                   Kokkos::View<float*, Kokkos::HostSpace>& scratch,
                   const std::function<void()>& between);

}  // namespace impl
}  // namespace kqlora
