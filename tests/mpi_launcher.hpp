#pragma once
// The launcher a test (itself a singleton MPI process) runs kqlora at np ranks under:
// KQLORA_TEST_MPIEXEC (set by tests/CMakeLists.txt for the binaries that use it), with the
// test's own launcher variables removed so they do not reach mpiexec, and one thread a rank.

#include <string>

#ifdef KQLORA_TEST_MPIEXEC
inline std::string mpi_launcher(int np) {
  return std::string(
             "env $(env | sed -n 's/^\\(\\(OMPI\\|PMIX\\)_[A-Za-z0-9_]*\\)=.*/-u \\1/p') "
             "OMP_NUM_THREADS=1 ") +
         KQLORA_TEST_MPIEXEC + " -np " + std::to_string(np) + " ";
}
#endif
