#pragma once
// Checked MPI calls: KQLORA_CHECK_MPI(MPI_Bcast(...)) throws kqlora::Error naming the call,
// the MPI error string, the file and the line.

#include "kqlora/build_config.hpp"
#include "kqlora/core/error.hpp"

#if KQLORA_HAVE_MPI
#include <mpi.h>

namespace kqlora::impl {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}

#define KQLORA_CHECK_MPI(call)                                                    \
  do {                                                                            \
    const int kqlora_mpi_rc_ = (call);                                            \
    if (kqlora_mpi_rc_ != MPI_SUCCESS)                                            \
      ::kqlora::impl::throw_mpi_error(kqlora_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
