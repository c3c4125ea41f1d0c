#pragma once
// Checked HDF5: every call goes through KQLORA_H5, which throws kqlora::Error naming the
// call, HDF5's own error stack, the file and the line. Handles close themselves.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kqlora/core/error.hpp"

namespace kqlora::h5 {

[[noreturn]] void throw_h5_error(const char* call, const char* file, int line);

template <class R>
R check(R ret, const char* call, const char* file, int line) {
  if (ret < 0) throw_h5_error(call, file, line);
  return ret;
}

/// An hid_t that closes itself with the right H5*close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(o.id_), new_file_(std::move(o.new_file_)) {
    o.id_ = H5I_INVALID_HID;
  }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      new_file_ = std::move(o.new_file_);
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  void reset();
  /// Closes now and reports a failure (a destructor cannot); files flush here.
  void close();
  /// A file this handle is creating (create_file): closed by an error instead of close(),
  /// it is truncated first (see reset).
  void set_new_file(std::string path) { new_file_ = std::move(path); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  std::string new_file_;  // create_file's path until close(): emptied if abandoned
};

/// While one is alive (on this thread), a failed HDF5 call is reported as bad input naming
/// `path` (InputError, exit 2: a file HDF5 cannot read back is damaged or not the kind of
/// file it claims to be) instead of a system failure. Readers of user files hold one; the
/// innermost names the file.
class InputFileScope {
 public:
  explicit InputFileScope(std::string path);
  ~InputFileScope();
  InputFileScope(const InputFileScope&) = delete;
  InputFileScope& operator=(const InputFileScope&) = delete;

 private:
  std::string previous_;
};

/// Silences HDF5's automatic error printing (errors are reported through exceptions).
void quiet_errors();

/// Files kqlora writes use HDF5's 1.10 file format (superblock 3, object headers 2, the
/// newer chunk indexes, H5Pset_libver_bounds): every piece of metadata carries a checksum,
/// so a changed byte in a chunk index or an object header is refused on reading instead of
/// silently read back (the default, older format checksums none). Readable by HDF5 >= 1.10.
void set_checksummed_format(hid_t fapl);
/// True when the open file's metadata is checksummed (superblock version 2 or later).
bool metadata_checksummed(hid_t file);

Handle create_file(const std::string& path);
Handle open_file(const std::string& path, bool writable = false);
/// From now on open_file(path) (read-only) opens these bytes through HDF5's in-memory core
/// driver instead of the file system (data null: forget the path). For the fuzzers
/// (tests/fuzz): a reader exercised without a disk in the loop. The bytes must outlive the
/// opens.
void register_file_image(const std::string& path, const void* data, size_t size);
Handle open_group(hid_t loc, const std::string& name);
/// Creates a group (and any missing parents).
Handle create_group(hid_t loc, const std::string& name);
bool exists(hid_t loc, const std::string& name);

/// bfloat16 as a 2-byte IEEE-style float: sign bit 15, exponent bits 7-14 (bias 127),
/// mantissa bits 0-6; h5py and h5dump read it as float32.
hid_t bfloat16_type();

/// The chunk shape of every checkpoint dataset: at most ~1 Mi elements, whole trailing
/// dimensions first (so a chunk is a contiguous range of the flattened dataset).
std::vector<int64_t> chunk_dims(const std::vector<int64_t>& dims);

/// Creates a checkpoint dataset (chunked by chunk_dims, Fletcher32 checksums, parents
/// created as needed). `allocate_early`: every chunk's file space reserved at creation (a
/// filtered chunk at its filtered size), so chunks written later with H5Dwrite_chunk land
/// in place and change no metadata (what lets ranks write them independently).
Handle create_checkpoint_dataset(hid_t loc, const std::string& name, hid_t file_type,
                                 const std::vector<int64_t>& dims, bool allocate_early = false);

/// Dimensions of a dataset, or an InputError naming `file` and the object.
std::vector<int64_t> dataset_dims(hid_t loc, const std::string& name, const std::string& file);
/// Time spent and bytes read by read_dataset in this process (a restart's log splits
/// its set-up with them): reading chunks, and verifying the checksums kqlora checks itself
/// (inside read_s where HDF5's pipeline checks them).
struct ReadStats {
  double read_s = 0, verify_s = 0;
  int64_t bytes = 0;
};
ReadStats& read_stats();

/// Reads a whole dataset converted to mem_type; checks the element count and every
/// chunk's checksum (a damaged file is an InputError naming `file` and the dataset).
void read_dataset(hid_t loc, const std::string& name, hid_t mem_type, int64_t expected_numel,
                  void* data, const std::string& file);
/// Elements [lo, hi) of a dataset's flattened values into `data` (element lo's place),
/// converted to mem_type, with the same checks (only the chunks holding them are read).
void read_dataset_range(hid_t loc, const std::string& name, hid_t mem_type, int64_t lo, int64_t hi,
                        void* data, const std::string& file);
/// The dataset's stored type class and size (e.g. H5T_FLOAT, 2 for bfloat16).
void dataset_type(hid_t loc, const std::string& name, H5T_class_t* cls, size_t* size);
/// The exponent width of a float dataset's type (8 for float32 and bfloat16, 5 for half).
size_t float_exponent_bits(hid_t loc, const std::string& name);

void write_attribute(hid_t obj, const std::string& name, const std::string& value);
void write_attribute(hid_t obj, const std::string& name, int64_t value);
void write_attribute(hid_t obj, const std::string& name, const std::vector<int64_t>& value);
bool has_attribute(hid_t obj, const std::string& name);
std::string read_string_attribute(hid_t obj, const std::string& name, const std::string& where);
/// A dataset holding one 64-bit integer (as kqlora writes /rng/seed): InputError naming
/// `where` for another type or shape (a float64 seed must not pass as a seed).
int64_t read_int64_dataset(hid_t loc, const std::string& name, const std::string& where);
/// A single integer attribute (InputError naming `where` when it holds 0 or several).
int64_t read_int64_attribute(hid_t obj, const std::string& name, const std::string& where);
std::vector<int64_t> read_int_attribute(hid_t obj, const std::string& name,
                                        const std::string& where);

/// "[a, b]" for messages.
std::string shape_text(const std::vector<int64_t>& shape);

/// Paths (relative to `loc`, no leading '/') of all datasets below loc, in name order.
std::vector<std::string> list_datasets(hid_t loc);

}  // namespace kqlora::h5

#define KQLORA_H5(call) ::kqlora::h5::check((call), #call, __FILE__, __LINE__)
