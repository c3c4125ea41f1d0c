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

}  // namespace kqlora
