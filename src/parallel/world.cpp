#include "kqlora/parallel/world.hpp"

#include <cstdint>

#include "kqlora/core/mpi_check.hpp"

namespace kqlora::world {

#if KQLORA_HAVE_MPI
int rank() {
  int r = 0;
  KQLORA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}
int size() {
  int s = 1;
  KQLORA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}
std::string broadcast(const std::string& s) {
  int64_t n = static_cast<int64_t>(s.size());
  KQLORA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  KQLORA_CHECK_MPI(MPI_Bcast(&out[0], static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD));
  return out;
}
void abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
}
#else
int rank() {
  return 0;
}
int size() {
  return 1;
}
std::string broadcast(const std::string& s) {
  return s;
}
void abort(int) {}
#endif

}  // namespace kqlora::world
