#pragma once
// Process-wide start-up and shut-down: MPI (when built with it), then Kokkos; undone in
// reverse order. Apps and test mains hold one for their whole life.

namespace kqlora {

class Runtime {
 public:
  Runtime(int& argc, char**& argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  bool owns_mpi_ = false;
};

/// The processes of this job on this node (MPI_COMM_TYPE_SHARED), 1 without MPI.
int ranks_on_this_node();

/// A library was left in a state its shut-down would crash on (HDF5 after a file close
/// that failed on a full disk): the process is ending on that error, so Runtime's
/// destructor then ends it at once with exit code 1, without MPI_Finalize or the
/// libraries' exit handlers.
void mark_unsafe_shutdown();
bool unsafe_shutdown();

}  // namespace kqlora
