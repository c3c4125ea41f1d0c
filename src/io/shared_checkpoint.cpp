#include "kqlora/io/shared_checkpoint.hpp"

#include <algorithm>

#include "kqlora/core/build_info.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/io/hdf5_file.hpp"

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

/// Selects elements [lo, hi) of a row-major dataspace of rank 1 or 2 (at most three
/// hyperslabs: the partial first row, the whole rows, the partial last row).
void select_flat_range(hid_t space, const std::vector<int64_t>& dims, int64_t lo, int64_t hi) {
  if (lo >= hi) {
    KQLORA_H5(H5Sselect_none(space));
    return;
  }
  if (dims.size() == 1) {
    const hsize_t start = lo, count = hi - lo;
    KQLORA_H5(H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
    return;
  }
  KQLORA_THROW_IF(dims.size() != 2, "shared checkpoint: datasets of rank " << dims.size());
  const int64_t C = dims[1];
  bool first = true;
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

void write_part(hid_t file, hid_t dxpl, const SharedPart& p) {
  Handle ds = h5::create_checkpoint_dataset(file, p.path, file_type(p.type), p.dims);
  Handle fspace(KQLORA_H5(H5Dget_space(ds)));
  select_flat_range(fspace, p.dims, p.lo, p.hi);
  const hsize_t n = static_cast<hsize_t>(std::max<int64_t>(p.hi - p.lo, 0));
  const hsize_t one = 1;
  // Whole rows: a memory space of the selection's own shape lets HDF5 map chunks by
  // hyperslab instead of element by element (measured: 31% -> ~50% of dd's bandwidth).
  const bool rows = p.dims.size() == 2 && n > 0 && p.lo % p.dims[1] == 0 && p.hi % p.dims[1] == 0;
  const hsize_t shape2[2] = {n / (rows ? hsize_t(p.dims[1]) : 1), rows ? hsize_t(p.dims[1]) : 1};
  Handle mspace(rows ? KQLORA_H5(H5Screate_simple(2, shape2, nullptr))
                     : KQLORA_H5(H5Screate_simple(1, n ? &n : &one, nullptr)));
  if (!n) KQLORA_H5(H5Sselect_none(mspace));
  // Every rank takes part in every write (collective), with an empty selection if need be.
  KQLORA_H5(H5Dwrite(ds, mem_type(p.type), mspace, fspace, dxpl, p.data));
}

}  // namespace

std::string write_checkpoint_shared(const std::string& save_dir, const SharedCheckpoint& s,
                                    int64_t keep_last, dist::Communicator& comm) {
  return commit_checkpoint(save_dir, s.header.step, keep_last, comm, [&](const std::string& tmp) {
    const std::string path = tmp + "/checkpoint.h5";
    h5::quiet_errors();
    Handle fapl(KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS)));
    KQLORA_H5(H5Pset_fapl_mpio(fapl, comm.mpi_comm(), MPI_INFO_NULL));
    KQLORA_H5(H5Pset_all_coll_metadata_ops(fapl, true));
    KQLORA_H5(H5Pset_coll_metadata_write(fapl, true));
    Handle file(KQLORA_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)));
    Handle dxpl(KQLORA_H5(H5Pcreate(H5P_DATASET_XFER)));
    KQLORA_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    const CheckpointContents& c = s.header;
    h5::write_attribute(file, "format", std::string("kqlora-checkpoint"));
    h5::write_attribute(file, "format_version", int64_t(1));
    h5::write_attribute(file, "step", c.step);
    h5::write_attribute(file, "world_size", int64_t(c.world_size));
    h5::write_attribute(file, "parallel", c.parallel);
    h5::write_attribute(file, "layout", std::string("shared"));
    h5::write_attribute(file, "config", c.config_text);
    h5::write_attribute(file, "kqlora_version", version());
    for (const auto& p : s.parts) write_part(file, dxpl, p);
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
    // What an exact resume needs besides the tensors (rank 0 writes the values).
    const int64_t seed = c.seed, next = c.step, mine = comm.rank() == 0 ? 1 : 0;
    write_part(file, dxpl, {SharedPart::Type::i64, "rng/seed", {1}, 0, mine, &seed});
    write_part(file, dxpl, {SharedPart::Type::i64, "data/next_step", {1}, 0, mine, &next});
    {
      Handle data = h5::open_group(file, "data");
      h5::write_attribute(data, "source", c.data_source);
    }
    dxpl.reset();
    file.close();
    if (comm.rank() == 0) fsync_file(path);
  });
}

}  // namespace kqlora
