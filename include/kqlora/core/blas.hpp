#pragma once
// Dense matrix products through Kokkos Kernels (its gemm dispatches to the CPU BLAS for
// host views and to cuBLAS for CUDA views). The version difference lives here: Kokkos
// Kernels 3.7 added the execution-space argument; remove the 3.4 branch when the floor
// moves past Debian 12.

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

namespace kqlora {

/// The dense matrices of kqlora: float32, column-major (LayoutLeft), as the BLAS takes them.
template <class MemSpace>
using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, MemSpace>;

/// C = alpha * op(A) op(B) + beta * C, ops "N" or "T", on `exec`.
template <class ExecSpace, class AView, class BView, class CView>
void gemm(const ExecSpace& exec, const char* ta, const char* tb, float alpha, const AView& A,
          const BView& B, float beta, const CView& C) {
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 30700
  KokkosBlas::gemm(exec, ta, tb, alpha, A, B, beta, C);
#else
  (void)exec;  // 3.4: the default instance of the views' space
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
#endif
}

}  // namespace kqlora
