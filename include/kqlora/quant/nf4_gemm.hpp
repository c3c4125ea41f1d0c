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

/// Rank-r products of the fused product's A that it computes from each block of A while
/// the block is in cache (a LoRA adapter's thin products, nn/lora_projection.hpp), instead
/// of a pass of their own over A [rows, k] each. Both optional (null: not computed):
/// - right [rows, rank] (leading dimension ldr) = right_alpha * A V, V [k, rank] read at
///   v[kk * v_stride_k + j * v_stride_j] (x A^T: V = A^T; g B: V = B);
/// - left [rank, k] (leading dimension ldl) = left_alpha * H^T A, plus left itself when
///   left_accumulate, H [rows, rank] (leading dimension ldh).
/// - with u set (and right): C += u_alpha * right U as well, U [rank, n] read at
///   u[j * u_stride_j + col * u_stride_n], added to each tile of C in registers at the last
///   block of k, when right is complete for its rows (an adapter's output term, s h B^T or
///   g_h A, without a pass of its own over C); rank at most kNf4GemmMaxAddedRank.
/// The sums run block by block of k (right) or of rows (left): a BLAS's order differs.
struct Nf4GemmSideProducts {
  int64_t rank = 0;
  float* right = nullptr;
  int64_t ldr = 0;
  const float* v = nullptr;
  int64_t v_stride_k = 0, v_stride_j = 0;
  float right_alpha = 1.0f;
  float* left = nullptr;
  int64_t ldl = 0;
  const float* h = nullptr;
  int64_t ldh = 0;
  float left_alpha = 1.0f;
  bool left_accumulate = false;
  const float* u = nullptr;
  int64_t u_stride_j = 0, u_stride_n = 0;
  float u_alpha = 1.0f;
};

/// The largest rank whose term C += right U the fused kernel adds in registers.
constexpr int64_t kNf4GemmMaxAddedRank = 64;

namespace impl {

/// Whether this build has the fused host kernel for W's layout: AVX-512 compiled in
/// (KQLORA_NATIVE on such a CPU), float32 or bfloat16 NF4, block_size a multiple of 16
/// dividing 512 (the kernel's block of the summed index), in a multiple of block_size.
bool nf4_gemm_host_supports(const Nf4Layout& layout);

/// C = A op(W) + beta C on the host, A [rows, k] and C [rows, n] row-major with leading
/// dimensions lda and ldc (forward: k = in, n = out, op(W) = W^T; input gradient: k = out,
/// n = in, op(W) = W). `scratch` holds the packed A block (grown when too small).
/// `between` (if set) runs after each block of k, from the calling thread. `side` (if set):
/// its products of A too. Requires nf4_gemm_host_supports(W.layout).
void nf4_gemm_host(const Kokkos::DefaultHostExecutionSpace& exec,
                   const Nf4Tensor<Kokkos::HostSpace>& W, Nf4GemmOp op, int64_t rows,
                   const float* A, int64_t lda, float beta, float* C, int64_t ldc,
                   Kokkos::View<float*, Kokkos::HostSpace>& scratch,
                   const std::function<void()>& between, const Nf4GemmSideProducts* side = nullptr);

}  // namespace impl
}  // namespace kqlora
