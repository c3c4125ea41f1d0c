// libFuzzer: a SentencePiece tokenizer.model (the protobuf reader behind the GGUF
// tokenizer export). The reader takes a path: the input goes to a file of this process's own.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "kqlora/core/error.hpp"
#include "kqlora/io/sentencepiece_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kqlora-fuzz-" + std::to_string(::getpid()) + ".model";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const auto m = kqlora::read_sentencepiece_model(path);
    size_t bytes = 0;
    for (const auto& p : m.pieces) bytes += p.piece.size();
    (void)bytes;
  } catch (const kqlora::InputError&) {
  }
  return 0;
}
