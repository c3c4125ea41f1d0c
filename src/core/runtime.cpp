#include "kqlora/core/runtime.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/gpu_arch.hpp"
#include "kqlora/core/mpi_check.hpp"

namespace kqlora {

namespace {
int node_ranks = 1;  // Runtime sets it
}  // namespace

#if KQLORA_HAVE_MPI
namespace impl {
void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw_error(std::string(call) + " failed: " + std::string(text, len), file, line);
}
}  // namespace impl
#endif

#if KQLORA_HAVE_MPI && defined(OPEN_MPI)
namespace {
/// Open MPI started without a launcher (a singleton: one process, no peers) probes every
/// network transport and starts a helper daemon: 0.4 s of a run's start measured here,
/// against 0.07 s with the loopback transports and no daemon. Nothing is lost: a
/// singleton has no one to talk to. The user's own settings win.
void quick_singleton_start() {
  for (const char* launched : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_FD",
                               "PMI_SIZE", "SLURM_PROCID", "MPI_LOCALNRANKS"})
    if (std::getenv(launched)) return;
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  setenv("OMPI_MCA_pml", "ob1", 0);
}
}  // namespace
#endif

Runtime::Runtime(int& argc, char**& argv) {
  // The BLAS kernel can only be chosen by re-executing, which must happen before MPI starts.
  int mpi_running = 0;
#if KQLORA_HAVE_MPI
  KQLORA_CHECK_MPI(MPI_Initialized(&mpi_running));
#endif
  if (!mpi_running) select_blas_kernel(argv);
#ifdef __GLIBC__
  // Keep freed large blocks in the heap rather than unmapping them: MPI allocates a
  // temporary buffer per collective, and returning those pages to the kernel makes every
  // allreduce page-fault and zero them again (measured: a 32 MiB gradient bucket 35 ms ->
  // 21 ms). Memory stays bounded by the peak the run reaches anyway.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
#if KQLORA_HAVE_MPI
  int initialized = 0;
  KQLORA_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
#ifdef OPEN_MPI
    quick_singleton_start();
#endif
    KQLORA_CHECK_MPI(MPI_Init(&argc, &argv));
    owns_mpi_ = true;
  }
  // Errors come back as codes that KQLORA_CHECK_MPI turns into exceptions.
  KQLORA_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  KQLORA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node;
  KQLORA_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int ranks_on_node = 1;
  KQLORA_CHECK_MPI(MPI_Comm_size(node, &ranks_on_node));
  KQLORA_CHECK_MPI(MPI_Comm_free(&node));
  node_ranks = ranks_on_node;
  select_blas_threads(ranks_on_node);
#else
  select_blas_threads(1);
#endif
  if (!Kokkos::is_initialized()) {
    try {
      check_gpus_run_this_build();  // (a CUDA build on no GPU or too old a one: a clear refusal)
    } catch (...) {
#if KQLORA_HAVE_MPI
      // (no destructor runs for a throwing constructor: MPI ends here, or Open MPI reports
      // an improper exit over the refusal)
      if (owns_mpi_) MPI_Finalize();
#endif
      throw;
    }
    Kokkos::initialize(argc, argv);
  }
}

namespace {
std::atomic<bool> unsafe{false};
}  // namespace

int ranks_on_this_node() {
  return node_ranks;
}

void mark_unsafe_shutdown() {
  unsafe = true;
}

bool unsafe_shutdown() {
  return unsafe;
}

Runtime::~Runtime() {
  if (unsafe) {
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (Kokkos::is_initialized()) Kokkos::finalize();
#if KQLORA_HAVE_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();  // no throw from a destructor
#endif
}

}  // namespace kqlora
