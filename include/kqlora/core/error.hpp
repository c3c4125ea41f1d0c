#pragma once
// Errors with context. The library throws; the apps turn an error into a message and an
// exit code (InputError: 2, anything else: 1).

#include <sstream>
#include <stdexcept>
#include <string>

namespace kqlora {

/// A failure inside kqlora or a library it calls (MPI, HDF5, CUDA, NCCL, Kokkos).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input from the user: a file, an argument, a size that cannot be used.
class InputError : public Error {
 public:
  using Error::Error;
};

/// Parses a whole string as an integer; InputError "<where>: expected an integer, got '…'".
long long parse_integer(const std::string& text, const std::string& where);

namespace impl {
[[noreturn]] void throw_error(const std::string& what, const char* file, int line);
[[noreturn]] void throw_input_error(const std::string& what);
}  // namespace impl

}  // namespace kqlora

/// Throws kqlora::Error with the message and the source location unless cond holds (a
/// program error; KQLORA_INPUT_CHECK takes its condition the same way round).
#define KQLORA_CHECK(cond, msg)                                           \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::ostringstream kqlora_msg_;                                     \
      kqlora_msg_ << msg;                                                 \
      ::kqlora::impl::throw_error(kqlora_msg_.str(), __FILE__, __LINE__); \
    }                                                                     \
  } while (0)

/// Throws kqlora::InputError with the message unless cond holds (no source location: the
/// message is for the user and names the file or argument at fault).
#define KQLORA_INPUT_CHECK(cond, msg)                       \
  do {                                                      \
    if (!(cond)) {                                          \
      std::ostringstream kqlora_msg_;                       \
      kqlora_msg_ << msg;                                   \
      ::kqlora::impl::throw_input_error(kqlora_msg_.str()); \
    }                                                       \
  } while (0)
