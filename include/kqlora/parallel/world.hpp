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
/// True when every rank calls this within `grace_s` seconds of this one (a non-blocking
/// barrier on MPI_COMM_WORLD, which the training's collectives do not use): an error every
/// rank found alike ends the job cleanly, one found on some ranks only does not leave them
/// waiting in a collective for the others. True without MPI.
bool world_all_arrive(double grace_s);
/// Ends every process of the job with `code` (MPI_Abort); returns only without MPI.
void world_abort(int code);

}  // namespace kqlora
