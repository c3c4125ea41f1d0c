#pragma once
// Tensor names read from input files become HDF5 link names (/params/<name>): one that is
// empty, "." or "..", or holds a '/', would land elsewhere in the file, be renamed, or fail
// inside HDF5, so it is refused where it is read (docs/RELIABILITY.md).

#include <string>

namespace kqlora {

/// InputError "<where>: tensor name '<name>' ..." unless `name` is a usable tensor name.
void check_tensor_name(const std::string& name, const std::string& where);

}  // namespace kqlora
