#pragma once
// No output may destroy an input (docs/RELIABILITY.md, "Writers"): before any work, every
// writer refuses an output that is one of its inputs, lies inside an input directory, or
// (a directory output) contains an input. Paths are compared with their folders' links
// resolved (the last part as written: a `latest` link is the link), fully resolved, and by
// device and inode, so symbolic links, hard links and ".." do not get around the check.

#include <string>
#include <vector>

namespace kqlora {

/// One input of a writer: its path (a file or a directory) and what it is in messages
/// ("the data_file", "the run's hf_model_dir").
struct WriterInput {
  std::string path, what;
};

/// InputError "<option> <out> is <what> <path>" (or "is inside <what> <path>", "contains
/// <what> <path>") when `out` overlaps one of `inputs`. Empty paths are skipped; a path
/// that does not exist is compared by name only. `may_contain`: a directory output that
/// only adds entries of its own (a save_dir) may hold inputs.
void refuse_output_over_inputs(const std::string& option, const std::string& out,
                               const std::vector<WriterInput>& inputs, bool may_contain = false);

/// InputError unless `out` can be a file output: not an existing directory, and its folder
/// exists (checked up front, so a long export does not end in "is a directory").
void check_file_output(const std::string& option, const std::string& out);

/// `p` absolute, its folders resolved (links too) and its last part kept as written: the
/// path a write to `p` touches.
std::string written_path(const std::string& p);

}  // namespace kqlora
