#include "kqlora/core/error.hpp"

#include <cerrno>
#include <cstdlib>

namespace kqlora {

long long parse_integer(const std::string& text, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  KQLORA_INPUT_CHECK(!text.empty() && *end == '\0' && errno == 0,
                     where << ": expected an integer, got '" << text << "'");
  return v;
}

}  // namespace kqlora

namespace kqlora::impl {

void throw_error(const std::string& what, const char* file, int line) {
  std::ostringstream os;
  os << what << " (" << file << ":" << line << ")";
  throw Error(os.str());
}

void throw_input_error(const std::string& what) {
  throw InputError(what);
}

}  // namespace kqlora::impl
