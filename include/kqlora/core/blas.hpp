#pragma once
// Dense matrix products. Host float matrices go straight to the host GEMM engine
// (core/gemm_engine.hpp: oneDNN or the Fortran BLAS; any strides with one of them 1, so a
// column block of a row-major matrix needs no copy); other
// memory spaces through Kokkos Kernels (cuBLAS for CUDA views where the layouts allow, its
// own kernels otherwise). Float32 CUDA views whose rows or columns are contiguous (the
// LayoutStride column blocks of the NF4 panels and the attention's per-head blocks among
// them) go to cuBLAS directly (cublasGemmEx), as Kokkos Kernels would send them to its own
// kernel. The Kokkos Kernels version difference lives here: 3.7 added the execution-space
// argument; remove the 3.4 branch when the floor moves past Debian 12.

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kqlora/core/error.hpp"
#include "kqlora/core/gemm_calls.hpp"
#include "kqlora/core/gemm_engine.hpp"
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
#include <KokkosBlas_tpl_spec.hpp>  // cuBLAS, and Kokkos Kernels' handle
#endif

#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
#endif

namespace kqlora {

/// The dense matrices of kqlora: float32 [rows, columns], row-major (LayoutRight): a
/// [tokens, features] activation keeps each token's features contiguous, as PyTorch does.
/// (Measured against column-major activations: the products of a LoRA layer at 128 - 256
/// tokens run 4 - 10% faster so with OpenBLAS; docs/BENCHMARKS.md.)
template <class MemSpace>
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, MemSpace>;

namespace impl {

/// How the column-major BLAS sees a matrix view: its memory as a column-major matrix with
/// leading dimension ld, which is the view itself, or (`row_major`) its transpose.
struct BlasOperand {
  bool ok = false, row_major = false;
  int ld = 1;
};

template <class View>
BlasOperand blas_operand(const View& v) {
  const int64_t r = static_cast<int64_t>(v.extent(0)), c = static_cast<int64_t>(v.extent(1));
  const int64_t s0 = static_cast<int64_t>(v.stride(0)), s1 = static_cast<int64_t>(v.stride(1));
  BlasOperand o;
  // Row-major wherever the rows are contiguous (a single column counts as either).
  if ((s1 == 1 || c <= 1) && s0 >= std::max<int64_t>(1, c) && s0 <= INT_MAX) {
    o = {true, true, static_cast<int>(std::max<int64_t>(1, s0))};
  } else if ((s0 == 1 || r <= 1) && s1 >= std::max<int64_t>(1, r) && s1 <= INT_MAX) {
    o = {true, false, static_cast<int>(std::max<int64_t>(1, s1))};
  }
  return o;
}

/// C = alpha op(A) op(B) + beta C as a column-major BLAS (Fortran BLAS, cuBLAS) takes it.
struct ColumnMajorGemm {
  bool ok = false;       // every operand is a matrix such a BLAS can address
  bool swapped = false;  // a is B's data and b is A's (C row-major: C^T is computed)
  char ta = 'N', tb = 'N';
  int m = 0, n = 0, k = 0, lda = 1, ldb = 1, ldc = 1;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
};

template <class AView, class BView, class CView>
ColumnMajorGemm column_major_gemm(const char* ta, const char* tb, const AView& A, const BView& B,
                                  const CView& C) {
  const auto a = blas_operand(A), b = blas_operand(B), c = blas_operand(C);
  const bool tA = ta[0] == 'T' || ta[0] == 't', tB = tb[0] == 'T' || tb[0] == 't';
  const int64_t m = C.extent(0), n = C.extent(1), k = tA ? A.extent(0) : A.extent(1);
  ColumnMajorGemm g;
  if (!(a.ok && b.ok && c.ok && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX)) return g;
  // In column-major terms: C row-major is C^T = op(B)^T op(A)^T; an operand stored
  // row-major is its transpose in column-major memory, so its flag flips.
  const bool swap = c.row_major;
  const BlasOperand& o1 = swap ? b : a;
  const BlasOperand& o2 = swap ? a : b;
  const bool t1 = swap ? !tB : tA, t2 = swap ? !tA : tB;
  g.ok = true;
  g.swapped = swap;
  g.ta = (t1 != o1.row_major) ? 'T' : 'N';
  g.tb = (t2 != o2.row_major) ? 'T' : 'N';
  g.m = static_cast<int>(swap ? n : m);
  g.n = static_cast<int>(swap ? m : n);
  g.k = static_cast<int>(k);
  g.a = swap ? B.data() : A.data();
  g.lda = o1.ld;
  g.b = swap ? A.data() : B.data();
  g.ldb = o2.ld;
  g.c = C.data();
  g.ldc = c.ld;
  return g;
}

}  // namespace impl

/// What a product's float32 inputs hold. `bfloat16`: both are bfloat16 values (a
/// bfloat16 run's rounded activations against a bfloat16 NF4 weight), so a GPU may
/// multiply them on its bfloat16 tensor cores, exactly, accumulating in float32 (cuBLAS'
/// CUBLAS_COMPUTE_32F_FAST_16BF), and a host with AMX or AMD's AVX512_BF16 through oneDNN
/// (host_bf16_products()); other hosts compute in float32, their fast path.
enum class GemmInputs { float32, bfloat16 };

namespace impl {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
/// cuBLAS on the execution space's stream, through Kokkos Kernels' handle.
inline cublasHandle_t cublas_on(const Kokkos::Cuda& exec) {
  cublasHandle_t h = KokkosBlas::Impl::CudaBlasSingleton::singleton().handle;
  const cublasStatus_t st = cublasSetStream(h, exec.cuda_stream());
  KQLORA_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed: status " << int(st));
  return h;
}
inline cublasOperation_t cublas_op(char t) {
  return t == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
}
inline cublasComputeType_t cublas_compute(GemmInputs inputs) {
  return inputs == GemmInputs::bfloat16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}
/// A product cuBLAS runs: float32 CUDA views, on the CUDA execution space.
template <class ExecSpace, class AView, class BView, class CView>
constexpr bool cublas_takes() {
  using Mem = typename CView::memory_space;
  return (std::is_same<Mem, Kokkos::CudaSpace>::value ||
          std::is_same<Mem, Kokkos::CudaUVMSpace>::value) &&
         std::is_same<ExecSpace, Kokkos::Cuda>::value &&
         std::is_same<typename AView::non_const_value_type, float>::value &&
         std::is_same<typename BView::non_const_value_type, float>::value &&
         std::is_same<typename CView::non_const_value_type, float>::value;
}
#endif
}  // namespace impl

/// C = alpha * op(A) op(B) + beta * C, ops "N" or "T", on `exec`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& exec, const char* ta, const char* tb, float alpha, const AView& A,
          const BView& B, float beta, const CView& C, GemmInputs inputs = GemmInputs::float32) {
  (void)inputs;  // (read by the host and CUDA branches this build has)
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
  using Mem = typename CView::memory_space;
  if constexpr (std::is_same<Mem, Kokkos::HostSpace>::value &&
                Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
                std::is_same<typename CView::non_const_value_type, float>::value) {
    const auto a = impl::blas_operand(A), b = impl::blas_operand(B), c = impl::blas_operand(C);
    const bool tA = ta[0] == 'T' || ta[0] == 't', tB = tb[0] == 'T' || tb[0] == 't';
    const int64_t m = C.extent(0), n = C.extent(1), k = tA ? A.extent(0) : A.extent(1);
    if (a.ok && b.ok && c.ok && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX) {
      if (m == 0 || n == 0) return;
      if (k > 0 && host_gemm_engine() == GemmEngine::onednn) {
        // oneDNN is row-major: an operand stored column-major is its transpose there (its
        // flag flips), and a column-major C is computed as C^T = op(B)^T op(A)^T.
        const bool swap = !c.row_major;
        const impl::BlasOperand& o1 = swap ? b : a;
        const impl::BlasOperand& o2 = swap ? a : b;
        const bool t1 = swap ? !tB : tA, t2 = swap ? !tA : tB;
        using Product = void (*)(char, char, int64_t, int64_t, int64_t, float, const float*,
                                 int64_t, const float*, int64_t, float, float*, int64_t);
        const Product product = inputs == GemmInputs::bfloat16 && host_bf16_products()
                                    ? Product(impl::onednn_bf16_gemm)
                                    : Product(impl::onednn_sgemm);
        impl::count_gemm_call();
        product(t1 == o1.row_major ? 'T' : 'N', t2 == o2.row_major ? 'T' : 'N', swap ? n : m,
                swap ? m : n, k, alpha, swap ? B.data() : A.data(), o1.ld,
                swap ? A.data() : B.data(), o2.ld, beta, C.data(), c.ld);
        return;
      }
      const impl::ColumnMajorGemm g = impl::column_major_gemm(ta, tb, A, B, C);
      (void)exec;  // (host BLAS: synchronous)
      impl::count_gemm_call();
      sgemm_(&g.ta, &g.tb, &g.m, &g.n, &g.k, &alpha, g.a, &g.lda, g.b, &g.ldb, &beta, g.c, &g.ldc);
      return;
    }
  }
#endif
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
  if constexpr (impl::cublas_takes<ExecSpace, AView, BView, CView>()) {
    const impl::ColumnMajorGemm g = impl::column_major_gemm(ta, tb, A, B, C);
    if (g.ok) {
      if (g.m == 0 || g.n == 0) return;
      impl::count_gemm_call();
      const cublasStatus_t st =
          cublasGemmEx(impl::cublas_on(exec), impl::cublas_op(g.ta), impl::cublas_op(g.tb), g.m,
                       g.n, g.k, &alpha, g.a, CUDA_R_32F, g.lda, g.b, CUDA_R_32F, g.ldb, &beta, g.c,
                       CUDA_R_32F, g.ldc, impl::cublas_compute(inputs), CUBLAS_GEMM_DEFAULT);
      KQLORA_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmEx (" << g.m << " x " << g.n << " x "
                                                                 << g.k << ") failed: status "
                                                                 << int(st));
      return;
    }
  }
#endif
  if (C.extent(0) == 0 || C.extent(1) == 0) return;  // (nothing to call)
  impl::count_gemm_call();
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 30700
  KokkosBlas::gemm(exec, ta, tb, alpha, A, B, beta, C);
#else
  (void)exec;  // 3.4: the default instance of the views' space
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
#endif
}

/// C = alpha op(A) op(W) + beta C on the host's bfloat16 hardware (host_bf16_products()):
/// A a host float32 matrix view of bfloat16 values, W a row-major [w_rows, w_cols] matrix
/// of bfloat16 bits with row stride ldw (a frozen weight's 16-bit copy, a bfloat16 NF4
/// panel), C row-major or a column block of a row-major matrix.
template <class AView, class CView>
void gemm_bf16_weight(const char* ta, const char* tb, float alpha, const AView& A,
                      const uint16_t* W, int64_t w_rows, int64_t w_cols, int64_t ldw, float beta,
                      const CView& C) {
  // (a run-time check: callers compile it for every space and call it on the host only)
  KQLORA_CHECK(
      (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename CView::memory_space>::accessible),
      "gemm_bf16_weight: host matrices");
  const auto a = impl::blas_operand(A), c = impl::blas_operand(C);
  const bool tA = ta[0] == 'T' || ta[0] == 't', tB = tb[0] == 'T' || tb[0] == 't';
  const int64_t m = C.extent(0), n = C.extent(1), k = tA ? A.extent(0) : A.extent(1);
  KQLORA_CHECK(a.ok && c.ok && c.row_major && k > 0 &&
                   static_cast<int64_t>(tA ? A.extent(1) : A.extent(0)) == m &&
                   (tB ? w_cols : w_rows) == k && (tB ? w_rows : w_cols) == n && ldw >= w_cols,
               "gemm_bf16_weight: operands " << A.extent(0) << "x" << A.extent(1) << ", " << w_rows
                                             << "x" << w_cols << ", " << m << "x" << n);
  if (m == 0 || n == 0) return;
  impl::count_gemm_call();
  // (an A stored column-major is its transpose in row-major terms: its flag flips)
  impl::onednn_bf16_gemm(tA == a.row_major ? 'T' : 'N', tB ? 'T' : 'N', m, n, k, alpha, A.data(),
                         a.ld, impl::Bf16Operand{nullptr, W, ldw}, beta, C.data(), c.ld);
}

/// The matrix view `v` moved `offset` elements on (same extents and strides, unmanaged).
/// (The strides are given explicitly: Kokkos 3.4's layout() of a strided subview has lost
/// them.)
/// Its device is ExecSpace's on the view's memory: Kokkos Kernels 4.x's portable gemm takes
/// no views of another execution space (a Serial call on HostSpace views of an OpenMP build
/// did not compile).
template <class ExecSpace, class View>
auto shifted(const View& v, int64_t offset) {
  static_assert(View::rank == 2, "shifted: a matrix view");
  const Kokkos::LayoutStride layout(v.extent(0), v.stride(0), v.extent(1), v.stride(1));
  return Kokkos::View<typename View::data_type, Kokkos::LayoutStride,
                      Kokkos::Device<ExecSpace, typename View::memory_space>,
                      Kokkos::MemoryUnmanaged>(v.data() + offset, layout);
}

/// C_b = alpha * op(A_b) op(B_b) + beta * C_b for b = 0 .. batch - 1, X_b being X moved
/// b * stride_x elements on (A, B, C: the first of each, as gemm takes them). On CUDA one
/// cublasGemmStridedBatchedEx call where gemm would call cuBLAS; elsewhere a gemm each, in
/// order (a stride may be 0: every product reads the same operand).
template <class ExecSpace, class AView, class BView, class CView>
void gemm_strided_batched(const ExecSpace& exec, const char* ta, const char* tb, float alpha,
                          const AView& A, int64_t stride_a, const BView& B, int64_t stride_b,
                          float beta, const CView& C, int64_t stride_c, int64_t batch,
                          GemmInputs inputs = GemmInputs::float32) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS)
  if constexpr (impl::cublas_takes<ExecSpace, AView, BView, CView>()) {
    const impl::ColumnMajorGemm g = impl::column_major_gemm(ta, tb, A, B, C);
    if (g.ok && batch > 0 && batch <= INT_MAX) {
      if (g.m == 0 || g.n == 0) return;
      impl::count_gemm_call();  // (one call for the whole batch)
      const cublasStatus_t st = cublasGemmStridedBatchedEx(
          impl::cublas_on(exec), impl::cublas_op(g.ta), impl::cublas_op(g.tb), g.m, g.n, g.k,
          &alpha, g.a, CUDA_R_32F, g.lda, g.swapped ? stride_b : stride_a, g.b, CUDA_R_32F, g.ldb,
          g.swapped ? stride_a : stride_b, &beta, g.c, CUDA_R_32F, g.ldc, stride_c,
          static_cast<int>(batch), impl::cublas_compute(inputs), CUBLAS_GEMM_DEFAULT);
      KQLORA_CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmStridedBatchedEx ("
                                                    << g.m << " x " << g.n << " x " << g.k << ", "
                                                    << batch << " products) failed: status "
                                                    << int(st));
      return;
    }
  }
#endif
  for (int64_t b = 0; b < batch; ++b)
    gemm(exec, ta, tb, alpha, shifted<ExecSpace>(A, b * stride_a),
         shifted<ExecSpace>(B, b * stride_b), beta, shifted<ExecSpace>(C, b * stride_c), inputs);
}

}  // namespace kqlora
