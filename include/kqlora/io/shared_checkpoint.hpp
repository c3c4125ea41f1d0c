#pragma once
// The shared checkpoint layout: one file, step-XXXXXXXX/checkpoint.h5, written in parallel
// through parallel HDF5 over MPI-IO. Every dataset has its global shape; each rank writes
// its own part of it (a range of the flattened dataset: its FSDP shards, or an even split
// in whole chunks of what every DDP rank holds). Rank 0 lays the file out (attributes,
// datasets with every chunk allocated: h5::layout_fapl leaves HDF5's fillers as holes);
// every rank then writes the chunks that lie whole in its range straight into their places
// (H5Dwrite_chunk, Fletcher32 computed here), and the partial chunks at range boundaries
// go through one collective filtered write, with collective metadata operations. The file
// reads back like any whole checkpoint (HDF5 verifies every chunk's checksum).

#include <cstdint>
#include <string>
#include <vector>

#include "kqlora/io/checkpoint.hpp"
#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

/// This rank's part of one dataset: elements [lo, hi) of the flattened global dataset,
/// `data` pointing at element lo (native float, int8 or uint8 as `type` says).
struct SharedPart {
  enum class Type { f32, bf16, i8, u8, i64 } type = Type::f32;
  std::string path;  // e.g. "params/layers.0.lora_a.weight"
  std::vector<int64_t> dims;
  int64_t lo = 0, hi = 0;
  const void* data = nullptr;
};

/// An NF4 group's attributes (the same on every rank).
struct SharedNf4Group {
  std::string path;
  Nf4Layout layout;
};

struct SharedCheckpoint {
  CheckpointContents
      header;  // step, world_size, parallel, config, optimizer_steps, seed, data_source
  std::vector<SharedNf4Group> nf4_groups;
  std::vector<SharedPart> parts;  // every rank lists every dataset, in the same order
};

/// The slowest write a healthy file system is taken to sustain for a shared checkpoint's
/// whole file (all ranks together): 10 MB/s.
constexpr double kSharedWriteFloorBytesPerS = 10e6;
/// How long a rank may spend in a shared checkpoint's write before the watchdog ends the
/// job (exit 1): comm_timeout_s plus the whole file at kSharedWriteFloorBytesPerS.
double shared_write_deadline_s(double comm_timeout_s, int64_t file_bytes);

/// Writes and commits save_dir/step-XXXXXXXX/checkpoint.h5 (collective). A rank that
/// hangs or dies inside the write ends the job after shared_write_deadline_s (the
/// watchdog, parallel/communicator.hpp), naming the step, the rank and what it waited for.
std::string write_checkpoint_shared(const std::string& save_dir, const SharedCheckpoint& s,
                                    int64_t keep_last, Communicator& comm);

/// An even split of n elements: rank r's [lo, hi).
std::pair<int64_t, int64_t> even_range(int64_t n, int rank, int size);
/// An even split of a dataset of `dims` in whole chunks (the chunking every checkpoint
/// dataset gets): rank r's [lo, hi) of the flattened dataset.
std::pair<int64_t, int64_t> chunk_range(const std::vector<int64_t>& dims, int rank, int size);

}  // namespace kqlora
