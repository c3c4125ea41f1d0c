#pragma once
// Training and evaluation batches: from an HDF5 file (`inputs` [rows, dim], `targets`
// [rows, dim] for mse) or synthetic from the counter-based generator. Step s uses the
// global rows s*global_bs .. (s+1)*global_bs - 1 (modulo the file's rows), so a step's
// global batch is the same whatever the world size.

#include <cstdint>
#include <string>
#include <vector>

namespace kqlora {

class DataSource {
 public:
  /// `path` empty: synthetic data from `seed`. `need_targets`: mse needs targets.
  DataSource(const std::string& path, int64_t dim, int64_t global_bs, uint64_t seed,
             bool need_targets, const std::string& what);

  /// Row-major [n, dim] inputs (and targets) of samples first .. first+n-1 of `step`, from
  /// the file (synthetic rows come from fill_normal_rows, keyed by global_sample).
  void inputs(int64_t step, int64_t first, int64_t n, float* out) const;
  void targets(int64_t step, int64_t first, int64_t n, float* out) const;
  bool synthetic() const { return path_.empty(); }
  /// Global sample index of sample `first` of `step` (the counter of synthetic rows).
  int64_t global_sample(int64_t step, int64_t first) const { return step * global_bs_ + first; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t dim_, global_bs_, rows_ = 0;
  uint64_t seed_;
  std::vector<float> inputs_, targets_;
  void fill(const std::vector<float>& src, int64_t step, int64_t first, int64_t n,
            float* out) const;
};

}  // namespace kqlora
