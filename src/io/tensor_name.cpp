#include "kqlora/io/tensor_name.hpp"

#include "kqlora/core/error.hpp"

namespace kqlora {

void check_tensor_name(const std::string& name, const std::string& where) {
  KQLORA_INPUT_CHECK(!name.empty(), where << ": an empty tensor name");
  KQLORA_INPUT_CHECK(name != "." && name != "..",
                     where << ": tensor name '" << name << "' is not a name");
  KQLORA_INPUT_CHECK(name.find('/') == std::string::npos,
                     where << ": tensor name '" << name << "' contains '/'");
  KQLORA_INPUT_CHECK(name.find('\0') == std::string::npos,
                     where << ": tensor name '" << name.c_str() << "...' contains a NUL byte");
}

}  // namespace kqlora
