#include "kqlora/core/human_units.hpp"

#include <iomanip>
#include <sstream>

namespace kqlora {

std::string human_bytes(double b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (b >= 1 << 30)
    os << b / (1 << 30) << " GiB";
  else if (b >= 1 << 20)
    os << b / (1 << 20) << " MiB";
  else
    os << b / 1024 << " KiB";
  return os.str();
}

std::string human_time(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 10 ? 2 : 1) << s << "s";
  return os.str();
}

}  // namespace kqlora
