#include "kqlora/train/tokenizer_identity.hpp"

#include <sys/stat.h>

#include "kqlora/core/sha256.hpp"

namespace kqlora {

TokenizerIdentity tokenizer_identity(const std::string& model_dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::string path = model_dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      return {sha256_hex_of_file(path), path};
  }
  return {};
}

}  // namespace kqlora
