#include "kqlora/parallel/world.hpp"

#include <cstdint>

#include "kqlora/core/mpi_check.hpp"

namespace kqlora {

#if KQLORA_HAVE_MPI
int world_rank() {
  int r = 0;
  KQLORA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}
int world_size() {
  int s = 1;
  KQLORA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}
std::string world_broadcast(const std::string& s) {
  int64_t n = static_cast<int64_t>(s.size());
  KQLORA_CHECK_MPI(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  KQLORA_CHECK_MPI(MPI_Bcast(&out[0], static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD));
  return out;
}
void world_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
}
#else
int world_rank() {
  return 0;
}
int world_size() {
  return 1;
}
std::string world_broadcast(const std::string& s) {
  return s;
}
void world_abort(int) {}
#endif

}  // namespace kqlora
