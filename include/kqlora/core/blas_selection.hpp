#pragma once
// Making the linked BLAS run its best kernel with a sensible thread count (docs/BLAS.md).
//
// OpenBLAS built with DYNAMIC_ARCH picks its kernels ("core") from CPUID when it is loaded,
// and an OpenBLAS older than the CPU falls back to a generic core (Debian 12's 0.3.21 runs
// "Prescott" SSE kernels on recent Intel Xeons: 5x slower sgemm). The core can only be
// chosen before the library loads, through OPENBLAS_CORETYPE, so kqlora::Runtime sets it
// and re-executes the process before MPI or Kokkos start. Any BLAS still links: OpenBLAS's
// functions are looked up at run time.

#include <string>

#include "kqlora/core/cpu_features.hpp"

namespace kqlora {

/// The OpenBLAS core to ask for on `cpu` when the BLAS chose `current` (a name as
/// openblas_get_corename returns it), or "" to keep it. A core is replaced only when its
/// sgemm kernel is narrower than the CPU's widest FMA: AVX-512 F/BW/DQ/VL -> "SkylakeX"
/// ("Cooperlake" with AVX512_BF16), AVX2+FMA -> "Haswell" ("Zen" on AMD and Hygon).
/// Unknown core names (a newer OpenBLAS than kqlora knows) are kept.
std::string preferred_openblas_core(const CpuFeatures& cpu, const std::string& current);

/// Called by kqlora::Runtime before MPI_Init: unless the user set OPENBLAS_CORETYPE or
/// KQLORA_BLAS_AUTOTUNE=0, when preferred_openblas_core asks for another core, sets
/// OPENBLAS_CORETYPE and re-executes the program with `argv` (it does not return then).
/// KQLORA_BLAS_TEST_CORENAME=NAME makes this detection see NAME as the BLAS's core (a test
/// hook for CPUs the BLAS knows).
void select_blas_kernel(char** argv);

/// Called by kqlora::Runtime once the ranks on this node are known: unless the user set
/// OPENBLAS_NUM_THREADS or GOTO_NUM_THREADS (or OMP_NUM_THREADS for an OpenMP BLAS), each
/// rank's BLAS gets its share of the cores: min(CPUs it may run on, online CPUs / ranks on
/// the node), at least 1.
void select_blas_threads(int ranks_on_node);

/// The BLAS's thread count (1 where it cannot say).
int blas_threads();

/// One line for logs and --version: the library, its kernel, its threads, and what kqlora
/// changed, e.g. "OpenBLAS 0.3.21 (/usr/lib/.../libblas.so.3), kernel Zen, 1 thread;
/// kernel kept (...); threads from OPENBLAS_NUM_THREADS".
std::string describe_blas();

}  // namespace kqlora
