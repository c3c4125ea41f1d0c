#include "kqlora/train/data.hpp"

#include <cstring>

#include "kqlora/build_config.hpp"
#include "kqlora/core/error.hpp"
#if KQLORA_HAVE_HDF5
#include "kqlora/io/hdf5_file.hpp"
#endif

namespace kqlora {

DataSource::DataSource(const std::string& path, int64_t dim, int64_t global_bs, uint64_t seed,
                       bool need_targets, const std::string& what)
    : path_(path), dim_(dim), global_bs_(global_bs), seed_(seed) {
  if (path.empty()) return;
#if KQLORA_HAVE_HDF5
  auto f = h5::open_file(path);
  const std::string where = what + " " + path;
  const auto dims = h5::dataset_dims(f, "inputs", path);
  KQLORA_INPUT_CHECK(
      dims.size() == 2 && dims[1] == dim && dims[0] > 0,
      where << ": dataset 'inputs' must be [rows, " << dim << "], got "
            << (dims.size() == 2 ? std::to_string(dims[0]) + " x " + std::to_string(dims[1])
                                 : std::to_string(dims.size()) + " dimensions"));
  rows_ = dims[0];
  inputs_.resize(static_cast<size_t>(rows_ * dim));
  h5::read_dataset(f, "inputs", H5T_NATIVE_FLOAT, rows_ * dim, inputs_.data(), path);
  if (need_targets) {
    KQLORA_INPUT_CHECK(h5::exists(f, "targets"),
                       where << ": loss = mse needs a dataset 'targets' [rows, dim]");
    const auto td = h5::dataset_dims(f, "targets", path);
    KQLORA_INPUT_CHECK(td == dims, where << ": 'targets' must have the shape of 'inputs'");
    targets_.resize(inputs_.size());
    h5::read_dataset(f, "targets", H5T_NATIVE_FLOAT, rows_ * dim, targets_.data(), path);
  }
#else
  KQLORA_INPUT_CHECK(false, what << " " << path << ": this kqlora was built without HDF5");
#endif
}

void DataSource::fill(const std::vector<float>& src, int64_t step, int64_t first, int64_t n,
                      float* out) const {
  KQLORA_CHECK(!path_.empty(),
               "DataSource: synthetic rows are generated on the device "
               "(fill_normal_rows), not read");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = step * global_bs_ + first + i;  // global sample index over the run
    std::memcpy(out + i * dim_, src.data() + (g % rows_) * dim_, sizeof(float) * dim_);
  }
}

void DataSource::inputs(int64_t step, int64_t first, int64_t n, float* out) const {
  fill(inputs_, step, first, n, out);
}

void DataSource::targets(int64_t step, int64_t first, int64_t n, float* out) const {
  fill(targets_, step, first, n, out);
}

}  // namespace kqlora
