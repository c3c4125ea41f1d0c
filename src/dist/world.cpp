#include "kqlora/dist/world.hpp"

#include <algorithm>
#include <climits>

#include "kqlora/core/mpi_check.hpp"

namespace kqlora::world {

#if KQLORA_HAVE_MPI
namespace {
template <class T>
void allreduce(T* v, int64_t n, MPI_Datatype type, MPI_Op op) {
  for (int64_t done = 0; done < n;) {  // counts are int: large buffers go in pieces
    const int count = static_cast<int>(std::min<int64_t>(n - done, INT_MAX / 2));
    KQLORA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v + done, count, type, op, MPI_COMM_WORLD));
    done += count;
  }
}
}  // namespace

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
void barrier() {
  KQLORA_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
}
void allreduce_sum(double* v, int64_t n) {
  allreduce(v, n, MPI_DOUBLE, MPI_SUM);
}
void allreduce_sum(float* v, int64_t n) {
  allreduce(v, n, MPI_FLOAT, MPI_SUM);
}
void allreduce_min_sum_max(const double* v, int64_t n, double* mn, double* sum, double* mx) {
  for (int64_t i = 0; i < n; ++i) mn[i] = sum[i] = mx[i] = v[i];
  allreduce(mn, n, MPI_DOUBLE, MPI_MIN);
  allreduce(sum, n, MPI_DOUBLE, MPI_SUM);
  allreduce(mx, n, MPI_DOUBLE, MPI_MAX);
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
bool any(bool flag) {
  int v = flag ? 1 : 0;
  KQLORA_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return v != 0;
}
#else
int rank() {
  return 0;
}
int size() {
  return 1;
}
void barrier() {}
void allreduce_sum(double*, int64_t) {}
void allreduce_sum(float*, int64_t) {}
void allreduce_min_sum_max(const double* v, int64_t n, double* mn, double* sum, double* mx) {
  for (int64_t i = 0; i < n; ++i) mn[i] = sum[i] = mx[i] = v[i];
}
std::string broadcast(const std::string& s) {
  return s;
}
void abort(int) {}
bool any(bool flag) {
  return flag;
}
#endif

}  // namespace kqlora::world
