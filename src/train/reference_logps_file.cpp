#include "kqlora/train/reference_logps_file.hpp"

#include <cstdio>

#include "kqlora/build_config.hpp"
#include "kqlora/core/error.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/hdf5_file.hpp"
#endif

namespace kqlora {

std::string reference_logps_path(const std::string& save_dir, const std::string& what,
                                 const std::string& key) {
  return save_dir + "/reference_logps_" + what + "_" + key + ".h5";
}

bool read_reference_logps(const std::string& path, const std::string& key, int64_t rows,
                          std::vector<double>& out) {
#if KQLORA_HAVE_HDF5
  if (std::FILE* f = std::fopen(path.c_str(), "rb"))
    std::fclose(f);
  else
    return false;
  h5::InputFileScope scope(path);
  auto f = h5::open_file(path);
  if (!h5::has_attribute(f, "key") || h5::read_string_attribute(f, "key", path) != key)
    return false;
  const auto d = h5::dataset_dims(f, "logps", path);
  KQLORA_INPUT_CHECK(d.size() == 1 && d[0] == rows, path << ": dataset 'logps' must be [" << rows
                                                         << "], got " << h5::shape_text(d));
  out.resize(static_cast<size_t>(rows));
  h5::read_dataset(f, "logps", H5T_NATIVE_DOUBLE, rows, out.data(), path);
  return true;
#else
  (void)path, (void)key, (void)rows, (void)out;
  return false;
#endif
}

void write_reference_logps(const std::string& path, const std::string& key,
                           const std::vector<double>& values) {
#if KQLORA_HAVE_HDF5
  const std::string tmp = path + ".tmp";
  {
    auto f = h5::create_file(tmp);
    const hsize_t n = values.size();
    h5::Handle space(KQLORA_H5(H5Screate_simple(1, &n, nullptr)));
    h5::Handle d(KQLORA_H5(
        H5Dcreate2(f, "logps", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    KQLORA_H5(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    h5::write_attribute(f, "key", key);
  }
  KQLORA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0,
               "cannot rename " << tmp << " to " << path);
#else
  (void)path, (void)key, (void)values;
#endif
}

}  // namespace kqlora
