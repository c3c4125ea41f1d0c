#include "kqlora/parallel/world.hpp"

#include <chrono>
#include <cstdint>
#include <thread>

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
bool world_all_arrive(double grace_s) {
  MPI_Request req;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return false;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > grace_s) return false;  // (the request dies with the job)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
void world_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
}
#else
bool world_all_arrive(double) {
  return true;
}
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
