#include "app_main.hpp"

#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>

#include "kqlora/core/blas_selection.hpp"
#include "kqlora/core/build_info.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/gemm_engine.hpp"
#include "kqlora/core/runtime.hpp"
#include "kqlora/parallel/world.hpp"

namespace kqlora::app {

int run(int argc, char** argv, const std::string& name, const std::string& usage,
        const std::function<int(std::vector<std::string>&)>& body) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      return 0;
    }
  }
#ifdef KOKKOS_ENABLE_CUDA
  // A CUDA build says what it is without a GPU (the GPU check asks every binary first):
  // the Runtime below starts Kokkos on the device.
  for (const auto& a : args) {
    if (a == "--version") {
      std::cout << build_configuration();
      return 0;
    }
  }
#endif
  std::unique_ptr<Runtime> runtime;
  try {
    runtime = std::make_unique<Runtime>(argc, argv);
  } catch (const InputError& e) {  // (no GPU, or one this build's code cannot run on)
    std::cerr << name << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << name << ": error: cannot start MPI/Kokkos: " << e.what() << "\n";
    return 1;
  }
  // The runtime outlives the handlers below: they may still talk to MPI.
  try {
    select_gemm_engine();  // (KQLORA_GEMM; a bad value is an input error)
    for (const auto& a : args) {
      if (a == "--version") {
        std::cout << build_configuration();
        return 0;
      }
    }
    // The first line of every log: dense products run at the speed of this kernel.
    if (world_rank() == 0)
      std::cout << name << " " << version() << ": BLAS " << describe_blas() << "; GEMM engine "
                << describe_gemm_engine() << "\n";
    return body(args);
  } catch (const InputError& e) {
    // Input is mostly checked identically on every rank (decks, files, sizes), so every
    // rank stops here together and rank 0 speaks for all. An error found by some ranks
    // only (a file one rank reads) must not leave the others waiting in a collective:
    // they are ended (still exit 2) when they do not arrive within a few seconds.
    const int rank = world_rank(), size = world_size();
    if (rank == 0) std::cerr << name << ": error: " << e.what() << "\n";
    if (size > 1 && !world_all_arrive(10.0)) {
      if (rank != 0) std::cerr << name << ": error on rank " << rank << ": " << e.what() << "\n";
      world_abort(2);
    }
    return 2;
  } catch (const std::exception& e) {
    const int rank = world_rank(), size = world_size();
    std::cerr << name << ": error" << (size > 1 ? " on rank " + std::to_string(rank) : "") << ": "
              << e.what() << "\n";
    // Other ranks may wait in a collective for this one: end the whole job.
    if (size > 1) world_abort(1);
    return 1;
  }
}

bool take_option(std::vector<std::string>& args, const std::string& flag, std::string* value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      KQLORA_INPUT_CHECK(i + 1 < args.size(), flag << " needs a value");
      *value = args[i + 1];
      args.erase(args.begin() + i, args.begin() + i + 2);
      return true;
    }
    if (args[i].rfind(flag + "=", 0) == 0) {
      *value = args[i].substr(flag.size() + 1);
      args.erase(args.begin() + i);
      return true;
    }
  }
  return false;
}

bool take_flag(std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      args.erase(args.begin() + i);
      return true;
    }
  }
  return false;
}

}  // namespace kqlora::app
