#pragma once
// HDF5 checkpoints in the schema of docs/CHECKPOINTS.md, committed atomically:
// save_dir/step-XXXXXXXX.tmp/ is written (each file fsynced), renamed to step-XXXXXXXX once
// every rank has finished, then save_dir/latest is replaced. A kill at any moment leaves
// the previous checkpoint and `latest` intact.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/io/checkpoint_contents.hpp"
#include "kqlora/io/hdf5_params.hpp"
#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

/// The directory name of a step: step-00000012.
std::string step_dir_name(int64_t step);

/// Writes this rank's file of a per_rank checkpoint and commits the step directory
/// (collective over the run's ranks). keep_last > 0 removes older complete checkpoints
/// after the commit. Returns the committed directory.
std::string write_checkpoint_per_rank(const std::string& save_dir, const CheckpointContents& c,
                                      int64_t keep_last, Communicator& comm);

/// The commit protocol around `write(tmp_dir)` (collective): rank 0 prepares
/// save_dir/step-XXXXXXXX.tmp, every rank writes into it, then rank 0 syncs, renames it to
/// step-XXXXXXXX, replaces `latest` and applies keep_last. Returns the step directory.
std::string commit_checkpoint(const std::string& save_dir, int64_t step, int64_t keep_last,
                              Communicator& comm,
                              const std::function<void(const std::string& tmp_dir)>& write);
/// Before the first step (collective): every rank creates save_dir where missing and
/// writes and removes a probe file in it, so a save_dir that cannot hold checkpoints is
/// reported now, not after the training. A permission, read-only file system or
/// not-a-directory failure is an InputError on every rank (exit 2), another failure (a
/// full disk, an I/O error) an Error (exit 1); the failing rank's message names the path.
void check_save_dir(const std::string& save_dir, Communicator& comm);
/// fsync of a file (after HDF5 closed it).
void fsync_file(const std::string& path);

/// The warning for a format_version 1 file (read, but not fully verified).
inline constexpr const char* unchecksummed_warning =
    "format_version 1 (kqlora before its HDF5 metadata was checksummed): a damaged chunk "
    "index or object header in it may go unnoticed; the checkpoints written from now on are "
    "version 2";
/// Writes one checkpoint file (no commit protocol): used by the per-rank writer and tests.
void write_checkpoint_file(const std::string& path, const CheckpointContents& c);

/// The checkpoint files a path names: a file; a step directory (its rank-*.h5 in rank
/// order, or its checkpoint.h5); a save_dir (the step directory its `latest` names).
/// InputError naming the path when it holds none.
std::vector<std::string> checkpoint_files(const std::string& path);

/// Reads a checkpoint file: attributes, parameters (NF4 and float) and, when
/// `with_optimizer`, the optimizer state. Validates the format and every object read;
/// errors name the file and the object. `with_values` false: the float tensors and
/// optimizer states are listed with their shapes but their values left in the file (data
/// empty; CheckpointReader reads them where they are needed).
CheckpointContents read_checkpoint_file(const std::string& path, bool with_optimizer = false,
                                        bool with_values = true);

/// The whole state of a run from its files: an FSDP run's shards gathered (every rank's
/// file needed), a DDP run's rank 0 file as it is. Errors name `where`.
CheckpointContents assemble_checkpoint(const std::vector<CheckpointContents>& parts,
                                       const std::string& where);

}  // namespace kqlora
