#pragma once
// Input files are opened only once they are known to be files: a directory opens as a
// stream that reads nothing (or fails on its first read), which would otherwise pass as an
// empty deck or leave a header unread.

#include <string>

namespace kqlora {

/// InputError "<path>: ..." (naming `what`, e.g. "the deck") unless `path` names an
/// existing file that is not a directory and can be opened for reading.
void check_input_file(const std::string& path, const std::string& what);

}  // namespace kqlora
