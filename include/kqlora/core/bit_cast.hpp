#pragma once
// A bit cast usable inside kernels on host and device (std::bit_cast is C++20 and not
// device-callable everywhere; memcpy is, and compilers turn it into a register move).

#include <Kokkos_Macros.hpp>

#include <cstring>

namespace kqlora {

template <class To, class From>
KOKKOS_INLINE_FUNCTION To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

}  // namespace kqlora
