// libFuzzer: a checkpoint file as kqlora-diff and a restart read it (read_checkpoint_file:
// attributes, the model's table, NF4 groups, float tensors, optimizer state, seed and step),
// through HDF5's in-memory driver (h5::register_file_image): no disk in the loop. Anything
// but an InputError escaping, or a crash inside HDF5, is a finding.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/io/checkpoint.hpp"
#include "kqlora/io/hdf5_file.hpp"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("KQLORA_MEMORY_LIMIT", "268435456", 1);
  Kokkos::initialize(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz-checkpoint.h5";
  kqlora::h5::register_file_image(path, data, size);
  try {
    (void)kqlora::read_checkpoint_file(path, true, true);
  } catch (const kqlora::InputError&) {
  }
  kqlora::h5::register_file_image(path, nullptr, 0);
  return 0;
}
