#include "kqlora/core/error.hpp"

namespace kqlora::detail {

void throw_error(const std::string& what, const char* file, int line) {
  std::ostringstream os;
  os << what << " (" << file << ":" << line << ")";
  throw Error(os.str());
}

void throw_input_error(const std::string& what) {
  throw InputError(what);
}

}  // namespace kqlora::detail
