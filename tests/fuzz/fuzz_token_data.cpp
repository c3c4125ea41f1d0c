// libFuzzer: a token data file (input_ids, labels, vocab_size; docs/MODELS.md) as the
// trainer reads it, through HDF5's in-memory driver, and its rows as batches.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/train/data.hpp"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("KQLORA_MEMORY_LIMIT", "268435456", 1);
  Kokkos::initialize(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz-tokens.h5";
  kqlora::h5::register_file_image(path, data, size);
  try {
    kqlora::InputSpec spec;
    spec.tokens = true;
    spec.vocab = 512;
    const kqlora::DataSource source(path, spec, 2, 42, "data_file", true);
    for (int64_t step = 0; step < 3; ++step) (void)source.normaliser(step, false);
  } catch (const kqlora::InputError&) {
  }
  kqlora::h5::register_file_image(path, nullptr, 0);
  return 0;
}
