#pragma once
// What every kqlora app shares: --help and --version, and the translation of errors into
// a message and an exit code (0 success, 2 bad input, 1 anything else).

#include <functional>
#include <string>
#include <vector>

namespace kqlora::app {

/// Runs `body(args)` (the arguments after the program name, --help/--version handled) inside
/// a kqlora::Runtime; returns the process exit code.
int run(int argc, char** argv, const std::string& name, const std::string& usage,
        const std::function<int(std::vector<std::string>&)>& body);

/// Removes `--flag VALUE` (or `--flag=VALUE`) from args; returns true when present.
bool take_option(std::vector<std::string>& args, const std::string& flag, std::string* value);
/// Removes a bare `--flag`; returns true when present.
bool take_flag(std::vector<std::string>& args, const std::string& flag);

}  // namespace kqlora::app
