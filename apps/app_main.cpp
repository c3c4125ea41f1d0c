#include "app_main.hpp"

#include <cstdlib>
#include <exception>
#include <iostream>

#include "kqlora/core/build_info.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/core/runtime.hpp"

namespace kqlora::app {

int run(int argc, char** argv, const std::string& name, const std::string& usage,
        const std::function<int(std::vector<std::string>&)>& body) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      return 0;
    }
  }
  try {
    Runtime runtime(argc, argv);
    for (const auto& a : args) {
      if (a == "--version") {
        std::cout << build_configuration();
        return 0;
      }
    }
    return body(args);
  } catch (const InputError& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

bool take_option(std::vector<std::string>& args, const std::string& flag, std::string* value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      KQLORA_INPUT_CHECK(i + 1 < args.size(), flag << " needs a value");
      *value = args[i + 1];
      args.erase(args.begin() + i, args.begin() + i + 2);
      return true;
    }
    if (args[i].rfind(flag + "=", 0) == 0) {
      *value = args[i].substr(flag.size() + 1);
      args.erase(args.begin() + i);
      return true;
    }
  }
  return false;
}

bool take_flag(std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      args.erase(args.begin() + i);
      return true;
    }
  }
  return false;
}

long long parse_int(const std::string& value, const std::string& flag) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  KQLORA_INPUT_CHECK(!value.empty() && *end == '\0' && errno == 0,
                     flag << ": expected an integer, got '" << value << "'");
  return v;
}

}  // namespace kqlora::app
