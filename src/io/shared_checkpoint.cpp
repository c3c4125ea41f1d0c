#include "kqlora/io/shared_checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kqlora/core/build_info.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/io/hdf5_layout_driver.hpp"
#include "kqlora/io/streaming_writeback.hpp"

namespace kqlora {

std::pair<int64_t, int64_t> even_range(int64_t n, int rank, int size) {
  return {n * rank / size, n * (rank + 1) / size};
}

std::pair<int64_t, int64_t> chunk_range(const std::vector<int64_t>& dims, int rank, int size) {
  const auto chunk = h5::chunk_dims(dims);
  int64_t per = 1, n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    per *= chunk[i];
    n *= dims[i];
  }
  // Chunks of the flattened dataset are contiguous when they span whole trailing
  // dimensions (the chunking below makes them so up to ~1 Mi elements).
  const int64_t chunks = (n + per - 1) / per;
  const auto [c0, c1] = even_range(chunks, rank, size);
  return {std::min(n, c0 * per), std::min(n, c1 * per)};
}

namespace {

using h5::Handle;

hid_t file_type(SharedPart::Type t) {
  switch (t) {
    case SharedPart::Type::bf16:
      return h5::bfloat16_type();
    case SharedPart::Type::i8:
      return H5T_STD_I8LE;
    case SharedPart::Type::u8:
      return H5T_STD_U8LE;
    case SharedPart::Type::i64:
      return H5T_STD_I64LE;
    default:
      return H5T_IEEE_F32LE;
  }
}

hid_t mem_type(SharedPart::Type t) {
  switch (t) {
    case SharedPart::Type::bf16:
      return h5::bfloat16_type();
    case SharedPart::Type::i8:
      return H5T_NATIVE_INT8;
    case SharedPart::Type::u8:
      return H5T_NATIVE_UINT8;
    case SharedPart::Type::i64:
      return H5T_NATIVE_INT64;
    default:
      return H5T_NATIVE_FLOAT;
  }
}

/// Adds elements [lo, hi) of a row-major dataspace of rank 1 or 2 to its selection (at
/// most three hyperslabs: the partial first row, the whole rows, the partial last row);
/// `first`: replaces the selection instead.
void select_flat_range(hid_t space, const std::vector<int64_t>& dims, int64_t lo, int64_t hi,
                       bool first = true) {
  if (lo >= hi) {
    if (first) KQLORA_H5(H5Sselect_none(space));
    return;
  }
  if (dims.size() == 1) {
    const hsize_t start = lo, count = hi - lo;
    KQLORA_H5(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, &start, nullptr,
                                  &count, nullptr));
    return;
  }
  KQLORA_CHECK(dims.size() == 2, "shared checkpoint: datasets of rank " << dims.size());
  const int64_t C = dims[1];
  auto add = [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    const hsize_t start[2] = {hsize_t(row), hsize_t(col)},
                  count[2] = {hsize_t(rows), hsize_t(cols)};
    KQLORA_H5(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr,
                                  count, nullptr));
    first = false;
  };
  const int64_t r0 = lo / C, c0 = lo % C, r1 = hi / C, c1 = hi % C;
  if (r0 == r1) {
    add(r0, 1, c0, c1 - c0);
    return;
  }
  int64_t full_from = r0;
  if (c0 > 0) {
    add(r0, 1, c0, C - c0);
    full_from = r0 + 1;
  }
  add(full_from, r1 - full_from, 0, C);
  add(r1, 1, 0, c1);
}

using h5::Range;

/// The ranges of p left by write_whole_chunks, written collectively (every rank calls it,
/// with an empty selection if need be).
void write_pieces(hid_t ds, hid_t dxpl, const SharedPart& p, const std::vector<Range>& pieces) {
  Handle fspace(KQLORA_H5(H5Dget_space(ds)));
  const hsize_t n = static_cast<hsize_t>(std::max<int64_t>(p.hi - p.lo, 1));
  Handle mspace(KQLORA_H5(H5Screate_simple(1, &n, nullptr)));
  KQLORA_H5(H5Sselect_none(fspace));
  KQLORA_H5(H5Sselect_none(mspace));
  const std::vector<int64_t> flat{p.hi - p.lo};
  for (const auto& [a, b] : pieces) {
    select_flat_range(fspace, p.dims, a, b, false);
    select_flat_range(mspace, flat, a - p.lo, b - p.lo, false);
  }
  KQLORA_H5(H5Dwrite(ds, mem_type(p.type), mspace, fspace, dxpl, p.data));
}

/// The file's layout: root attributes, every dataset (allocated at creation: the chunks'
/// places are fixed before any rank writes one) and the group attributes.
void create_layout(hid_t file, const SharedCheckpoint& s, const std::vector<SharedPart>& parts) {
  const CheckpointContents& c = s.header;
  h5::write_attribute(file, "format", std::string("kqlora-checkpoint"));
  h5::write_attribute(file, "format_version", int64_t(2));
  h5::write_attribute(file, "step", c.step);
  h5::write_attribute(file, "world_size", int64_t(c.world_size));
  h5::write_attribute(file, "parallel", c.parallel);
  h5::write_attribute(file, "layout", std::string("shared"));
  h5::write_attribute(file, "config", c.config_text);
  if (!c.model_config_text.empty()) {  // (absent: readers take the model from `config`)
    h5::write_attribute(file, "model", c.table.model_kind);
    h5::write_attribute(file, "model_config", c.model_config_text);
  }
  if (!c.arch_text.empty()) h5::write_attribute(file, "hf_config", c.arch_text);
  if (!c.base_hash.empty()) h5::write_attribute(file, "base_hash", c.base_hash);
  if (!c.reference_hash.empty()) h5::write_attribute(file, "reference_hash", c.reference_hash);
  h5::write_attribute(file, "kqlora_version", version());
  for (const auto& p : parts)
    h5::create_checkpoint_dataset(file, p.path, file_type(p.type), p.dims, true).close();
  for (const auto& g : s.nf4_groups) {
    Handle grp = h5::open_group(file, g.path);
    h5::write_attribute(grp, "shape", g.layout.shape);
    h5::write_attribute(grp, "dtype", std::string(dtype_name(g.layout.dtype)));
    h5::write_attribute(grp, "block_size", g.layout.block_size);
    h5::write_attribute(grp, "scaler_block_size", g.layout.scaler_block_size);
  }
  {  // (MPI-IO files refuse to close while objects in them are open: scopes)
    Handle opt = h5::exists(file, "optimizer") ? h5::open_group(file, "optimizer")
                                               : h5::create_group(file, "optimizer");
    h5::write_attribute(opt, "step", c.optimizer_steps);
  }
  Handle data = h5::open_group(file, "data");
  h5::write_attribute(data, "source", c.data_source);
}

/// What a rank blocked in the shared write was waiting for, in the watchdog's line.
class WritePhase {
 public:
  WritePhase(Watchdog::Guard& guard, std::string head) : guard_(guard), head_(std::move(head)) {}
  void operator()(const std::string& what) { guard_.set_message(head_ + what + tail_); }

 private:
  Watchdog::Guard& guard_;
  std::string head_;
  const std::string tail_ =
      ": another rank is hung or dead (or the file system stalled); "
      "ending the job";
};

/// Every part into the laid-out file: whole chunks written by their rank, then the partial
/// chunks of the parts that have any (on any rank) written collectively.
void write_parts(hid_t file, hid_t dxpl, const std::vector<SharedPart>& parts, Communicator& comm,
                 StreamingWriteback& writeback, WritePhase& phase) {
  phase("the collective opening of the file's datasets (H5Dopen2, collective metadata)");
  std::vector<Handle> sets;  // opened by every rank alike (collective metadata reads)
  for (const auto& p : parts)
    sets.emplace_back(KQLORA_H5(H5Dopen2(file, p.path.c_str(), H5P_DEFAULT)));
  // The independent writes: an error on one rank must not leave the others waiting in the
  // collectives that follow, so it travels with the flags and every rank stops together.
  std::vector<std::vector<Range>> left(parts.size());
  std::vector<double> flags(parts.size() + 1, 0.0);  // partial chunks per part; last: failed
  std::string error;
  phase("its own whole chunks' writes (independent)");
  try {
    std::vector<char> buf;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& p = parts[i];
      left[i] = h5::write_whole_chunks(sets[i], p.dims, H5Tget_size(file_type(p.type)), p.lo, p.hi,
                                       p.data, buf, &writeback);
      flags[i] = left[i].empty() ? 0.0 : 1.0;
    }
  } catch (const std::exception& e) {
    error = e.what();
    flags.back() = 1.0;
  }
  phase("the other ranks' whole chunks (the allreduce after them)");
  comm.wait(comm.allreduce_sum(flags.data(), static_cast<int64_t>(flags.size())));
  KQLORA_CHECK(flags.back() <= 0,
               (error.empty() ? "another rank failed to write its chunks (see its error)" : error));
  for (size_t i = 0; i < parts.size(); ++i)
    if (flags[i] > 0) {
      phase("the collective write of " + parts[i].path + "'s partial chunks (H5Dwrite, MPI-IO)");
      write_pieces(sets[i], dxpl, parts[i], left[i]);
    }
  phase("the collective closing of the file's datasets (H5Dclose)");
}

/// The bytes of the whole file's datasets (every rank lists every dataset).
int64_t file_bytes(const std::vector<SharedPart>& parts) {
  int64_t bytes = 0;
  for (const auto& p : parts) {
    int64_t n = static_cast<int64_t>(H5Tget_size(file_type(p.type)));
    for (int64_t d : p.dims) n *= d;
    bytes += n;
  }
  return bytes;
}

/// The communicator's timeout for a scope (restored on the way out, errors included).
class ScopedTimeout {
 public:
  ScopedTimeout(Communicator& comm, double seconds) : comm_(comm), saved_(comm.timeout()) {
    comm_.set_timeout(seconds);
  }
  ~ScopedTimeout() { comm_.set_timeout(saved_); }
  ScopedTimeout(const ScopedTimeout&) = delete;
  ScopedTimeout& operator=(const ScopedTimeout&) = delete;

 private:
  Communicator& comm_;
  double saved_;
};

}  // namespace

double shared_write_deadline_s(double comm_timeout_s, int64_t file_bytes) {
  return comm_timeout_s + static_cast<double>(file_bytes) / kSharedWriteFloorBytesPerS;
}

std::string write_checkpoint_shared(const std::string& save_dir, const SharedCheckpoint& s,
                                    int64_t keep_last, Communicator& comm) {
  return commit_checkpoint(save_dir, s.header.step, keep_last, comm, [&](const std::string& tmp) {
    const std::string path = tmp + "/checkpoint.h5";
    h5::quiet_errors();
    // What an exact resume needs besides the tensors (rank 0 writes the values).
    const int64_t seed = s.header.seed, next = s.header.step, mine = comm.rank() == 0 ? 1 : 0;
    auto parts = s.parts;
    parts.push_back({SharedPart::Type::i64, "rng/seed", {1}, 0, mine, &seed});
    parts.push_back({SharedPart::Type::i64, "data/next_step", {1}, 0, mine, &next});

    // MPI-IO's collectives (the open, the collective writes, the close) cannot time out:
    // a rank that died or hung inside them would hold every other rank until the job's
    // time limit. The whole write runs under the watchdog instead (docs/CHECKPOINTS.md,
    // "A rank that hangs during a checkpoint"): past comm_timeout_s plus the file at
    // 10 MB/s, the rank still inside prints what it waits for and ends the job (exit 1).
    // The waits for other ranks in between (allreduces) get the same bound.
    const int64_t bytes = file_bytes(parts);
    const double deadline_s = shared_write_deadline_s(comm.timeout(), bytes);
    std::ostringstream head;
    head << "checkpoint of step " << s.header.step << " (shared layout, " << path << "): rank "
         << comm.rank() << " of " << comm.size() << " waited more than " << deadline_s
         << " s (comm_timeout_s " << comm.timeout() << " s + " << bytes << " bytes at 10 MB/s) in ";
    Watchdog::Guard guard(deadline_s, head.str());
    WritePhase phase(guard, head.str());
    ScopedTimeout timeout(comm, deadline_s);
    phase("the layout's creation (rank 0) and its allreduce");

    Handle fapl(KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS)));
    KQLORA_H5(H5Pset_fapl_mpio(fapl, comm.mpi_comm(), MPI_INFO_NULL));
    KQLORA_H5(H5Pset_all_coll_metadata_ops(fapl, true));
    KQLORA_H5(H5Pset_coll_metadata_write(fapl, true));
    // Rank 0 lays the file out alone (metadata; every chunk allocated, with its address
    // and size in the index) through the layout driver, which leaves HDF5's fillers of
    // filtered chunks as holes instead of writing the whole checkpoint twice (a collective
    // creation writes them all through MPI-IO: 0.6 - 2.4 s per GB on this machine). Then
    // every rank opens it through MPI-IO and writes its own chunks into their places.
    std::string error;
    if (comm.rank() == 0) {
      try {
        Handle layout(h5::layout_fapl());
        Handle f(KQLORA_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, layout)));
        create_layout(f, s, parts);
        f.close();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    double failed = error.empty() ? 0.0 : 1.0;
    comm.wait(comm.allreduce_sum(&failed, 1));
    KQLORA_CHECK(failed <= 0, (comm.rank() == 0 ? error : "rank 0 could not create " + path));
    phase("the collective open of the file (H5Fopen through MPI-IO)");
    Handle file(KQLORA_H5(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl)));
    Handle dxpl(KQLORA_H5(H5Pcreate(H5P_DATASET_XFER)));
    KQLORA_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    StreamingWriteback writeback(path);  // (measured: 0.71 - 0.99 s against 1.5 - 1.74 s)
    write_parts(file, dxpl, parts, comm, writeback, phase);
    dxpl.reset();
    phase("the collective close of the file (H5Fclose through MPI-IO)");
    file.close();
    // Every rank syncs what it wrote (on a parallel file system one client's fsync does
    // not cover another's writes; on a local disk the second finds nothing to do).
    phase("its fsync of the file");
    fsync_file(path);
  });
}

}  // namespace kqlora
