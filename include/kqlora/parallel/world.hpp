#pragma once
// The process group of a run as the apps see it before (and after) any Communicator
// exists: this process's rank and the world size, rank 0's deck text for every rank, and
// ending the whole job on an error. One process when built without MPI.

#include <string>

namespace kqlora {

int world_rank();
int world_size();
/// Rank 0's string on every rank.
std::string world_broadcast(const std::string& s);
/// Ends every process of the job with `code` (MPI_Abort); returns only without MPI.
void world_abort(int code);

}  // namespace kqlora
