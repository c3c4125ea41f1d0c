#pragma once
// A DPO run's precomputed reference log-probabilities (precompute_ref_log_probs = true;
// docs/TRAINING.md, "Preference training") kept beside its checkpoints: a side file
// save_dir/reference_logps_<data_file|eval_file>_<key>.h5, key the content hash of the data file's
// tokens, the base's identity (io/base_hash.hpp) and the starting adapters' hash -- so a
// restart, or another run on the same data, base and adapters, reads them instead of
// computing them again. Never written into the data file.

#include <string>
#include <vector>

namespace kqlora {

/// The side file's path for `key` (what: "data_file" or "eval_file").
std::string reference_logps_path(const std::string& save_dir, const std::string& what,
                                 const std::string& key);
/// The file's values when it exists and holds `rows` of them for `key`; false otherwise
/// (and in builds without HDF5). A damaged file is an InputError naming it.
bool read_reference_logps(const std::string& path, const std::string& key, int64_t rows,
                          std::vector<double>& out);
/// Writes them (rank 0), to a temporary name renamed into place.
void write_reference_logps(const std::string& path, const std::string& key,
                           const std::vector<double>& values);

}  // namespace kqlora
