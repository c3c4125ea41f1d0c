// libFuzzer: a safetensors file's header and its tensors' bytes (read_header validates
// the header in full before any tensor is read). The reader takes a path: the input goes
// to a file of this process's own.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kqlora-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const auto h = kqlora::safetensors::read_header(path);
    for (const auto& t : h.tensors) (void)kqlora::safetensors::read_bytes(h, t);
  } catch (const kqlora::InputError&) {
  }
  return 0;
}
