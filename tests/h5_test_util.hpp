#pragma once
// HDF5 reading for tests: a whole dataset's values as doubles.
#include <string>
#include <vector>

#include "kqlora/io/hdf5_file.hpp"

namespace kqlora_test {

inline std::vector<double> read_doubles(hid_t loc, const std::string& name,
                                        const std::string& file = "") {
  const auto dims = kqlora::h5::dataset_dims(loc, name, file.empty() ? name : file);
  int64_t n = 1;
  for (auto d : dims) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  kqlora::h5::read_dataset(loc, name, H5T_NATIVE_DOUBLE, n, v.data(), file.empty() ? name : file);
  return v;
}

}  // namespace kqlora_test
