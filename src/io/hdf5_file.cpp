#include "kqlora/io/hdf5_file.hpp"
#include "kqlora/core/seconds_since.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>

#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/runtime.hpp"
#include "kqlora/io/fletcher32.hpp"

namespace kqlora::h5 {

namespace {

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  // The first entries say what failed; the system's reason (errno, e.g. "No space left on
  // device") sits deeper in the stack.
  if (!e->desc) return 0;
  std::string d = e->desc;
  const size_t at = d.find("errno = ");
  if (at != std::string::npos) {  // "errno = 28, error message = 'No space left on device'"
    const size_t q = d.find("error message = '", at);
    const size_t end = q == std::string::npos ? std::string::npos : d.find('\'', q + 17);
    d = d.substr(at, end == std::string::npos ? 40 : end + 1 - at);
  } else if (n >= 3) {
    return 0;
  }
  std::replace(d.begin(), d.end(), '\n', ' ');
  *s += (s->empty() ? "" : "; ") + d;
  return 0;
}

ReadStats stats;

/// Reads elements [lo, hi) of a dataset of n elements stored as kqlora writes checkpoints
/// (chunks that are contiguous ranges of the flattened dataset, Fletcher32 the only
/// filter, the file's type the memory's, a little-endian host) chunk by chunk with
/// H5Dread_chunk straight into `data` (element lo's place), each checksum verified with
/// kqlora's Fletcher32: one copy out of the page cache and a vectorised check, where
/// HDF5's pipeline copies through a buffer per chunk and sums word by word (measured:
/// docs/BENCHMARKS.md). Returns false, having read nothing, for a dataset stored otherwise
/// (HDF5 reads it then).
bool read_flat_chunks(hid_t d, hid_t mem_type, int64_t n, int64_t lo, int64_t hi, void* data,
                      const std::string& what) {
  const uint16_t probe = 1;
  if (*reinterpret_cast<const uint8_t*>(&probe) != 1 || n <= 0) return false;
  Handle type(KQLORA_H5(H5Dget_type(d)));
  if (H5Tequal(type, mem_type) <= 0) return false;
  Handle dcpl(KQLORA_H5(H5Dget_create_plist(d)));
  if (H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_nfilters(dcpl) != 1) return false;
  unsigned flags = 0, info = 0;
  size_t nelem = 0;
  if (H5Pget_filter2(dcpl, 0, &flags, &nelem, nullptr, 0, nullptr, &info) != H5Z_FILTER_FLETCHER32)
    return false;
  Handle space(KQLORA_H5(H5Dget_space(d)));
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 1 || rank > 8) return false;
  hsize_t dims[8], chunk[8];
  KQLORA_H5(H5Sget_simple_extent_dims(space, dims, nullptr));
  if (H5Pget_chunk(dcpl, rank, chunk) != rank) return false;
  int64_t per = 1;
  for (int i = 0; i < rank; ++i) {
    if (i > 0 && chunk[i] != dims[i]) return false;  // not a contiguous range
    per *= static_cast<int64_t>(chunk[i]);
  }
  const size_t es = H5Tget_size(type);
  if (es == 0) return false;
  const size_t bytes = static_cast<size_t>(per) * es;
  std::vector<char> edge;  // a chunk only partly wanted (the last is stored whole, padded)
  char* out = static_cast<char*>(data) - static_cast<ptrdiff_t>(lo) * static_cast<ptrdiff_t>(es);
  std::vector<hsize_t> offset(static_cast<size_t>(rank), 0);
  for (int64_t a = lo / per * per; a < hi; a += per) {
    offset[0] = static_cast<hsize_t>(a / per) * chunk[0];
    hsize_t stored = 0;
    KQLORA_H5(H5Dget_chunk_storage_size(d, offset.data(), &stored));
    KQLORA_INPUT_CHECK(stored == bytes + 4, what << ": chunk at element " << a << " holds "
                                                 << stored << " bytes, " << bytes + 4
                                                 << " expected (damaged file)");
    // A chunk lying whole in [lo, hi) is read in place when the range after it has room
    // for its 4 checksum bytes: they land on the next chunk's first bytes, which the next
    // read overwrites. Any other chunk goes through `edge`.
    const int64_t a0 = std::max(a, lo), a1 = std::min(a + per, hi);
    const bool in_place = a >= lo && (hi - a - per) * static_cast<int64_t>(es) >= 4;
    char* dst = in_place ? out + static_cast<size_t>(a) * es : nullptr;
    if (!in_place) {
      edge.resize(bytes + 4);
      dst = edge.data();
    }
    uint32_t skipped = 0;
    auto t = std::chrono::steady_clock::now();
    KQLORA_INPUT_CHECK(H5Dread_chunk(d, H5P_DEFAULT, offset.data(), &skipped, dst) >= 0,
                       what << ": cannot read the chunk at element " << a << " (damaged file)");
    stats.read_s += seconds_since(t);
    t = std::chrono::steady_clock::now();
    uint32_t sum = 0;
    for (int i = 0; i < 4; ++i) sum |= uint32_t(static_cast<uint8_t>(dst[bytes + i])) << (8 * i);
    KQLORA_INPUT_CHECK(skipped == 0 && fletcher32(dst, bytes) == sum,
                       what << ": failed checksum (Fletcher32) in the chunk at element " << a
                            << " (damaged file)");
    stats.verify_s += seconds_since(t);
    if (!in_place)
      std::memcpy(out + static_cast<size_t>(a0) * es, dst + static_cast<size_t>(a0 - a) * es,
                  static_cast<size_t>(a1 - a0) * es);
    stats.bytes += static_cast<int64_t>(bytes) + 4;
  }
  return true;
}

}  // namespace

ReadStats& read_stats() {
  return stats;
}

namespace {
thread_local std::string input_file;  // InputFileScope's innermost path; empty: none
}  // namespace

InputFileScope::InputFileScope(std::string path) : previous_(std::move(input_file)) {
  input_file = std::move(path);
}

InputFileScope::~InputFileScope() {
  input_file = std::move(previous_);
}

void throw_h5_error(const char* call, const char* file, int line) {
  std::string stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &stack);
  H5Eclear2(H5E_DEFAULT);
  if (!input_file.empty()) {
    std::string fn(call);
    fn = fn.substr(0, fn.find('('));
    impl::throw_input_error(input_file +
                            ": damaged or not a file kqlora wrote (HDF5 cannot read it: " + fn +
                            (stack.empty() ? "" : ": " + stack) + ")");
  }
  impl::throw_error(std::string(call) + " failed" + (stack.empty() ? "" : ": " + stack), file,
                    line);
}

void quiet_errors() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

void Handle::reset() {
  if (id_ == H5I_INVALID_HID) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  // A file being written, abandoned by an error (a full disk): its blocks are freed first,
  // so that HDF5's flush of its metadata at this close can succeed. A close that fails
  // leaves HDF5 holding a half-closed file, which its shut-down would crash on.
  const bool abandoned = !new_file_.empty() && std::uncaught_exceptions() > 0;
  if (abandoned) (void)::truncate(new_file_.c_str(), 0);
  new_file_.clear();
  const bool file = H5Iget_type(id) == H5I_FILE;
  if (H5Idec_ref(id) < 0 && file) mark_unsafe_shutdown();  // closes when the last reference goes
}

void Handle::close() {
  if (id_ == H5I_INVALID_HID) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  new_file_.clear();
  if (H5Iget_type(id) == H5I_FILE) {
    if (H5Fclose(id) < 0) {
      mark_unsafe_shutdown();  // (see reset)
      throw_h5_error("H5Fclose(file)", __FILE__, __LINE__);
    }
  } else {
    KQLORA_H5(H5Idec_ref(id));
  }
}

void set_checksummed_format(hid_t fapl) {
  KQLORA_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
}

bool metadata_checksummed(hid_t file) {
  H5F_info2_t info;
  KQLORA_H5(H5Fget_info2(file, &info));
  return info.super.version >= 2;
}

Handle create_file(const std::string& path) {
  quiet_errors();
  Handle fapl(KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS)));
  set_checksummed_format(fapl);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  KQLORA_INPUT_CHECK(f >= 0, path << ": cannot create the HDF5 file");
  Handle h(f);
  h.set_new_file(path);
  return h;
}

namespace {
// Paths whose bytes are in memory (register_file_image): the fuzzers' files.
std::map<std::string, std::pair<const void*, size_t>>& file_images() {
  static std::map<std::string, std::pair<const void*, size_t>> images;
  return images;
}
}  // namespace

void register_file_image(const std::string& path, const void* data, size_t size) {
  if (data)
    file_images()[path] = {data, size};
  else
    file_images().erase(path);
}

Handle open_file(const std::string& path, bool writable) {
  quiet_errors();
  const auto image = file_images().find(path);
  if (image != file_images().end() && !writable) {
    // HDF5's core driver over the bytes (copied: HDF5 may not keep a pointer into them).
    Handle fapl(KQLORA_H5(H5Pcreate(H5P_FILE_ACCESS)));
    KQLORA_H5(H5Pset_fapl_core(fapl, 1 << 16, 0));
    KQLORA_H5(
        H5Pset_file_image(fapl, const_cast<void*>(image->second.first), image->second.second));
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    KQLORA_INPUT_CHECK(f >= 0, path << ": cannot open the HDF5 file");
    return Handle(f);
  }
  // H5Fis_hdf5 became H5Fis_accessible in HDF5 1.12; the shim goes with 1.10 support.
#if H5_VERSION_GE(1, 12, 0)
  const htri_t is_hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
  KQLORA_INPUT_CHECK(is_hdf5 > 0, path << ": not a readable HDF5 file");
  const hid_t f = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  KQLORA_INPUT_CHECK(f >= 0, path << ": cannot open the HDF5 file");
  return Handle(f);
}

Handle open_group(hid_t loc, const std::string& name) {
  return Handle(KQLORA_H5(H5Gopen2(loc, name.c_str(), H5P_DEFAULT)));
}

Handle create_group(hid_t loc, const std::string& name) {
  Handle lcpl(KQLORA_H5(H5Pcreate(H5P_LINK_CREATE)));
  KQLORA_H5(H5Pset_create_intermediate_group(lcpl, 1));
  return Handle(KQLORA_H5(H5Gcreate2(loc, name.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)));
}

bool exists(hid_t loc, const std::string& name) {
  // Walk the path so a missing parent is "no" rather than an error.
  size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string prefix = name.substr(0, pos);
    if (KQLORA_H5(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

hid_t bfloat16_type() {
  static hid_t type = [] {
    const hid_t t = KQLORA_H5(H5Tcopy(H5T_IEEE_F32LE));
    KQLORA_H5(H5Tset_fields(t, 15, 7, 8, 0, 7));  // sign, exponent pos/size, mantissa pos/size
    KQLORA_H5(H5Tset_size(t, 2));
    KQLORA_H5(H5Tset_precision(t, 16));
    KQLORA_H5(H5Tset_ebias(t, 127));
    return t;
  }();
  return type;
}

std::vector<int64_t> chunk_dims(const std::vector<int64_t>& dims) {
  std::vector<int64_t> chunk(dims.size());
  int64_t budget = int64_t(1) << 20;
  for (size_t i = dims.size(); i-- > 0;) {
    chunk[i] = std::max<int64_t>(1, std::min<int64_t>(dims[i], budget));
    budget = std::max<int64_t>(1, budget / chunk[i]);
  }
  return chunk;
}

Handle create_checkpoint_dataset(hid_t loc, const std::string& name, hid_t file_type,
                                 const std::vector<int64_t>& dims, bool allocate_early) {
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  const auto c = chunk_dims(dims);
  std::vector<hsize_t> chunk(c.begin(), c.end());
  Handle space(KQLORA_H5(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr)));
  Handle dcpl(KQLORA_H5(H5Pcreate(H5P_DATASET_CREATE)));
  KQLORA_H5(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  KQLORA_H5(H5Pset_fletcher32(dcpl));
  if (allocate_early) {
    KQLORA_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    // Every chunk is written afterwards: no fill values to compute (parallel HDF5 still
    // writes checksummed filler chunks at allocation, 5x faster so).
    KQLORA_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  }
  Handle lcpl(KQLORA_H5(H5Pcreate(H5P_LINK_CREATE)));
  KQLORA_H5(H5Pset_create_intermediate_group(lcpl, 1));
  // No chunk cache: every chunk is written whole, once, so a write that fails (a full
  // disk) fails now and leaves no dirty chunk behind, which HDF5 would try to flush again
  // when the library shuts down (and crash doing so at MPI_Finalize).
  Handle dapl(KQLORA_H5(H5Pcreate(H5P_DATASET_ACCESS)));
  KQLORA_H5(H5Pset_chunk_cache(dapl, 0, 0, 1.0));
  return Handle(KQLORA_H5(H5Dcreate2(loc, name.c_str(), file_type, space, lcpl, dcpl, dapl)));
}

std::vector<int64_t> dataset_dims(hid_t loc, const std::string& name, const std::string& file) {
  KQLORA_INPUT_CHECK(exists(loc, name), file << ": dataset '" << name << "' is missing");
  const hid_t ds = H5Dopen2(loc, name.c_str(), H5P_DEFAULT);
  KQLORA_INPUT_CHECK(ds >= 0, file << ": '" << name << "' is not a readable dataset");
  Handle d(ds);
  Handle space(KQLORA_H5(H5Dget_space(d)));
  const int rank = KQLORA_H5(H5Sget_simple_extent_ndims(space));
  KQLORA_INPUT_CHECK(rank <= 8, file << ": dataset '" << name << "' has " << rank
                                     << " dimensions (at most 8 expected)");
  std::vector<hsize_t> hd(rank);
  KQLORA_H5(H5Sget_simple_extent_dims(space, hd.data(), nullptr));
  std::vector<int64_t> dims;
  for (hsize_t x : hd) {
    KQLORA_INPUT_CHECK(x <= static_cast<hsize_t>(kMaxElements),
                       file << ": dataset '" << name << "' has a dimension of " << x);
    dims.push_back(static_cast<int64_t>(x));
  }
  checked_numel(dims, file + ": dataset '" + name + "'");  // every later product fits
  return dims;
}

void dataset_type(hid_t loc, const std::string& name, H5T_class_t* cls, size_t* size) {
  Handle d(KQLORA_H5(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  Handle t(KQLORA_H5(H5Dget_type(d)));
  *cls = H5Tget_class(t);
  *size = H5Tget_size(t);
}

size_t float_exponent_bits(hid_t loc, const std::string& name) {
  Handle d(KQLORA_H5(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  Handle t(KQLORA_H5(H5Dget_type(d)));
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  KQLORA_H5(H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize));
  return esize;
}

namespace {

/// A dataset compressed with a filter this libhdf5 lacks (h5py's LZF, Blosc, ...) is bad
/// input with its cure, not a "damaged file": HDF5 would only say it cannot read it.
void refuse_missing_filters(hid_t d, const std::string& name, const std::string& file) {
  Handle dcpl(KQLORA_H5(H5Dget_create_plist(d)));
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, info = 0;
    size_t nelem = 0;
    char fname[64] = {0};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, nullptr,
                                           sizeof(fname), fname, &info);
    if (id < 0 || H5Zfilter_avail(id) > 0) continue;
    const std::string known = id == 32000 ? "LZF, h5py's own compression" : fname;
    KQLORA_INPUT_CHECK(false, file << ": dataset '" << name << "' is compressed with filter " << id
                                   << " (" << known
                                   << "), which this HDF5 library does not have: rewrite it "
                                      "with gzip or without compression (h5py: "
                                      "compression=\"gzip\" or None)");
  }
}

}  // namespace

void read_dataset(hid_t loc, const std::string& name, hid_t mem_type, int64_t expected_numel,
                  void* data, const std::string& file) {
  const auto dims = dataset_dims(loc, name, file);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  KQLORA_INPUT_CHECK(n == expected_numel, file << ": dataset '" << name << "' has " << n
                                               << " elements, expected " << expected_numel);
  read_dataset_range(loc, name, mem_type, 0, n, data, file);
}

void read_dataset_range(hid_t loc, const std::string& name, hid_t mem_type, int64_t lo, int64_t hi,
                        void* data, const std::string& file) {
  const auto dims = dataset_dims(loc, name, file);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  KQLORA_INPUT_CHECK(0 <= lo && lo <= hi && hi <= n, file << ": dataset '" << name << "' has " << n
                                                          << " elements, elements [" << lo << ", "
                                                          << hi << ") wanted");
  if (lo == hi) return;
  Handle d(KQLORA_H5(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)));
  if (read_flat_chunks(d, mem_type, n, lo, hi, data, file + ": dataset '" + name + "'")) return;
  refuse_missing_filters(d, name, file);
  // Through HDF5's pipeline (conversions, other filters): a part goes through a copy of
  // the whole. A failed checksum (Fletcher32) or a truncated file fails here.
  const size_t es = H5Tget_size(mem_type);
  KQLORA_CHECK(es != 0, name << ": H5Tget_size failed");
  std::vector<char> whole;
  if (lo > 0 || hi < n) whole.resize(static_cast<size_t>(n) * es);
  const auto t = std::chrono::steady_clock::now();
  const herr_t rc =
      H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, whole.empty() ? data : whole.data());
  stats.read_s += seconds_since(t);
  if (rc < 0) {
    std::string stack;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &stack);
    H5Eclear2(H5E_DEFAULT);
    KQLORA_INPUT_CHECK(false, file << ": cannot read dataset '" << name << "' (damaged file or "
                                   << "failed checksum): " << stack);
  }
  if (!whole.empty())
    std::memcpy(data, whole.data() + static_cast<size_t>(lo) * es,
                static_cast<size_t>(hi - lo) * es);
}

void write_attribute(hid_t obj, const std::string& name, const std::string& value) {
  Handle type(KQLORA_H5(H5Tcopy(H5T_C_S1)));
  KQLORA_H5(H5Tset_size(type, std::max<size_t>(1, value.size())));
  KQLORA_H5(H5Tset_cset(type, H5T_CSET_UTF8));
  Handle space(KQLORA_H5(H5Screate(H5S_SCALAR)));
  Handle a(KQLORA_H5(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)));
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  KQLORA_H5(H5Awrite(a, type, padded.data()));
}

void write_attribute(hid_t obj, const std::string& name, int64_t value) {
  Handle space(KQLORA_H5(H5Screate(H5S_SCALAR)));
  Handle a(
      KQLORA_H5(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)));
  KQLORA_H5(H5Awrite(a, H5T_NATIVE_INT64, &value));
}

void write_attribute(hid_t obj, const std::string& name, const std::vector<int64_t>& value) {
  const hsize_t n = value.size();
  Handle space(KQLORA_H5(H5Screate_simple(1, &n, nullptr)));
  Handle a(
      KQLORA_H5(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)));
  if (n > 0) KQLORA_H5(H5Awrite(a, H5T_NATIVE_INT64, value.data()));
}

bool has_attribute(hid_t obj, const std::string& name) {
  return KQLORA_H5(H5Aexists(obj, name.c_str())) > 0;
}

std::string read_string_attribute(hid_t obj, const std::string& name, const std::string& where) {
  KQLORA_INPUT_CHECK(has_attribute(obj, name), where << ": attribute '" << name << "' is missing");
  Handle a(KQLORA_H5(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
  Handle type(KQLORA_H5(H5Aget_type(a)));
  KQLORA_INPUT_CHECK(H5Tget_class(type) == H5T_STRING,
                     where << ": attribute '" << name << "' is not a string");
  if (KQLORA_H5(H5Tis_variable_str(type)) > 0) {
    char* s = nullptr;
    Handle mem(KQLORA_H5(H5Tcopy(H5T_C_S1)));
    KQLORA_H5(H5Tset_size(mem, H5T_VARIABLE));
    KQLORA_H5(H5Tset_cset(mem, H5Tget_cset(type)));  // h5py writes UTF-8
    KQLORA_H5(H5Aread(a, mem, &s));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(type);
  std::string out(n, '\0');
  KQLORA_H5(H5Aread(a, type, &out[0]));
  return out.substr(0, out.find('\0'));
}

std::vector<int64_t> read_int_attribute(hid_t obj, const std::string& name,
                                        const std::string& where) {
  KQLORA_INPUT_CHECK(has_attribute(obj, name), where << ": attribute '" << name << "' is missing");
  Handle a(KQLORA_H5(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
  Handle type(KQLORA_H5(H5Aget_type(a)));
  KQLORA_INPUT_CHECK(H5Tget_class(type) == H5T_INTEGER,
                     where << ": attribute '" << name << "' is not an integer");
  Handle space(KQLORA_H5(H5Aget_space(a)));
  const hssize_t n = KQLORA_H5(H5Sget_simple_extent_npoints(space));
  // kqlora's integer attributes are scalars and shapes: a long one is a damaged file.
  KQLORA_INPUT_CHECK(n <= 64, where << ": attribute '" << name << "' holds " << n
                                    << " integers (at most 64 expected)");
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (n > 0) KQLORA_H5(H5Aread(a, H5T_NATIVE_INT64, out.data()));
  return out;
}

int64_t read_int64_dataset(hid_t loc, const std::string& name, const std::string& where) {
  const auto dims = dataset_dims(loc, name, where);
  H5T_class_t cls;
  size_t size;
  dataset_type(loc, name, &cls, &size);
  KQLORA_INPUT_CHECK(cls == H5T_INTEGER && size == 8 && dims == std::vector<int64_t>{1},
                     where << ": /" << name << " must hold one 64-bit integer, it holds "
                           << (cls == H5T_INTEGER ? "integers" : "non-integers") << " of " << size
                           << " bytes, shape " << shape_text(dims));
  int64_t v = 0;
  read_dataset(loc, name, H5T_NATIVE_INT64, 1, &v, where);
  return v;
}

int64_t read_int64_attribute(hid_t obj, const std::string& name, const std::string& where) {
  const auto v = read_int_attribute(obj, name, where);
  KQLORA_INPUT_CHECK(v.size() == 1, where << ": attribute '" << name << "' holds " << v.size()
                                          << " integers, expected one");
  return v[0];
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

namespace {
// H5Ovisit's callback changed in HDF5 1.12 (H5O_info2_t); the shim goes with 1.10 support.
#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
#else
using ObjectInfo = H5O_info_t;
#endif
herr_t visit(hid_t, const char* name, const ObjectInfo* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> list_datasets(hid_t loc) {
  std::vector<std::string> names;
#if H5_VERSION_GE(1, 12, 0)
  KQLORA_H5(H5Ovisit3(loc, H5_INDEX_NAME, H5_ITER_INC, visit, &names, H5O_INFO_BASIC));
#else
  KQLORA_H5(H5Ovisit2(loc, H5_INDEX_NAME, H5_ITER_INC, visit, &names, H5O_INFO_BASIC));
#endif
  return names;
}

}  // namespace kqlora::h5
