#pragma once
// The process group of a run (MPI_COMM_WORLD; one process when built without MPI): the
// few host-side collectives the trainer and checkpoints need. Every MPI call is checked.

#include <cstdint>
#include <string>
#include <vector>

namespace kqlora::world {

int rank();
int size();
void barrier();
/// In-place sum over ranks of n doubles / floats in host memory.
void allreduce_sum(double* v, int64_t n);
void allreduce_sum(float* v, int64_t n);
/// Min, sum and max over ranks of one value each, delivered on every rank.
void allreduce_min_sum_max(const double* v, int64_t n, double* mn, double* sum, double* mx);
/// Rank 0's string on every rank.
std::string broadcast(const std::string& s);
/// Ends every process of the job with `code` (MPI_Abort); returns only without MPI.
void abort(int code);
/// True on every rank if any rank passes true.
bool any(bool flag);

}  // namespace kqlora::world
