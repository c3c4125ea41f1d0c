#include "kqlora/core/input_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "kqlora/core/error.hpp"

namespace kqlora {

void check_input_file(const std::string& path, const std::string& what) {
  KQLORA_INPUT_CHECK(!path.empty(), "an empty path for " << what);
  struct stat st {};
  KQLORA_INPUT_CHECK(::stat(path.c_str(), &st) == 0,
                     path << ": cannot open " << what << ": " << std::strerror(errno));
  KQLORA_INPUT_CHECK(!S_ISDIR(st.st_mode), path << ": is a directory, not " << what);
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot open " << what << ": " << std::strerror(errno));
}

}  // namespace kqlora
