#include "kqlora/io/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>

#include "kqlora/core/build_info.hpp"
#include "kqlora/core/checked_size.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/io/chunk_writer.hpp"
#include "kqlora/io/streaming_writeback.hpp"
#include "kqlora/nn/model_registry.hpp"

namespace kqlora {

namespace {

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  KQLORA_CHECK(fd >= 0, "cannot open " << path << " to sync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  KQLORA_CHECK(rc == 0, "fsync " << path << " failed: " << std::strerror(err));
}

/// An errno that says the path is wrong (the user's to fix: exit 2), not the system.
bool is_path_errno(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR || err == EEXIST ||
         err == ENAMETOOLONG || err == ELOOP || err == ENOENT;
}

void make_dirs(const std::string& path) {
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      const int err = errno;
      KQLORA_INPUT_CHECK(!is_path_errno(err),
                         "cannot create directory " << prefix << ": " << std::strerror(err));
      KQLORA_CHECK(false, "cannot create directory " << prefix << ": " << std::strerror(err));
    }
  }
}

void remove_tree(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) {
    ::unlink(path.c_str());
    return;
  }
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    remove_tree(path + "/" + n);
  }
  ::closedir(d);
  ::rmdir(path.c_str());
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// Complete step directories (step-XXXXXXXX, no .tmp), oldest first.
std::vector<std::string> complete_steps(const std::string& save_dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(save_dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() == 13 && n.rfind("step-", 0) == 0 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

void fsync_file(const std::string& path) {
  fsync_path(path, false);
}

void write_checkpoint_file(const std::string& path, const CheckpointContents& c) {
  auto f = h5::create_file(path);
  StreamingWriteback writeback(path);  // the datasets' chunks stream through a few pages
  h5::write_attribute(f, "format", std::string("kqlora-checkpoint"));
  h5::write_attribute(f, "format_version", int64_t(2));
  h5::write_attribute(f, "step", c.step);
  h5::write_attribute(f, "world_size", int64_t(c.world_size));
  h5::write_attribute(f, "parallel", c.parallel);
  h5::write_attribute(f, "layout", c.layout);
  if (c.layout == "per_rank") h5::write_attribute(f, "rank", int64_t(c.rank));
  h5::write_attribute(f, "config", c.config_text);
  if (!c.model_config_text.empty()) {  // (absent: readers take the model from `config`)
    h5::write_attribute(f, "model", c.table.model_kind);
    h5::write_attribute(f, "model_config", c.model_config_text);
  }
  if (!c.arch_text.empty()) h5::write_attribute(f, "hf_config", c.arch_text);
  if (!c.base_hash.empty()) h5::write_attribute(f, "base_hash", c.base_hash);
  if (!c.reference_hash.empty()) h5::write_attribute(f, "reference_hash", c.reference_hash);
  h5::write_attribute(f, "kqlora_version", version());
  auto params = h5::create_group(f, "params");
  for (const auto& [name, t] : c.nf4) h5::write_nf4(params, name, t, &writeback);
  for (const auto& [name, s] : c.nf4_shards) h5::write_nf4_shard(params, name, s, &writeback);
  for (const auto& p : c.params) {
    if (p.first_element < 0) {
      h5::write_float(params, p.name, p.shape, p.data.data(), &writeback);
      continue;
    }
    // An FSDP slice of the flattened tensor (empty slices get a placeholder element).
    const float zero = 0.0f;
    const int64_t n = static_cast<int64_t>(p.data.size());
    h5::write_float(params, p.name, {std::max<int64_t>(n, 1)}, n ? p.data.data() : &zero,
                    &writeback);
    h5::Handle d(KQLORA_H5(H5Dopen2(params, p.name.c_str(), H5P_DEFAULT)));
    h5::write_attribute(d, "global_shape", p.global_shape);
    h5::write_attribute(d, "first_element", p.first_element);
    h5::write_attribute(d, "num_elements", n);
    h5::write_attribute(d, "shard_index", int64_t(p.shard_index));
    h5::write_attribute(d, "num_shards", int64_t(p.num_shards));
  }
  auto opt = h5::create_group(f, "optimizer");
  h5::write_attribute(opt, "step", c.optimizer_steps);
  for (const auto& entry : c.optimizer) {
    const auto& key = entry.first;
    const auto& values = entry.second;
    std::vector<int64_t> shape{static_cast<int64_t>(values.size())};
    for (const auto& p : c.params)
      if (p.name == key.first) shape = p.shape;
    h5::write_float(opt, key.first + "/" + key.second, shape, values.data(), &writeback);
  }
  auto rng = h5::create_group(f, "rng");
  const int64_t seed = c.seed;
  h5::write_dataset(rng, "seed", H5T_STD_I64LE, H5T_NATIVE_INT64, {1}, &seed, &writeback);
  auto data = h5::create_group(f, "data");
  const int64_t next_step = c.step;
  h5::write_dataset(data, "next_step", H5T_STD_I64LE, H5T_NATIVE_INT64, {1}, &next_step,
                    &writeback);
  h5::write_attribute(data, "source", c.data_source);
  f.close();
  fsync_path(path, false);
}

namespace {
/// True on every rank when any rank passes true.
bool any_rank(Communicator& comm, bool flag) {
  double v = flag ? 1.0 : 0.0;
  comm.wait(comm.allreduce_sum(&v, 1));
  return v > 0;
}
}  // namespace

void check_save_dir(const std::string& save_dir, Communicator& comm) {
  std::string error;
  bool input = true;  // the failure is the user's path (2), not the system (1)
  const auto note = [&](const std::string& what, int err) {
    error = save_dir + ": save_dir " + what + ": " + std::strerror(err);
    input = is_path_errno(err);
  };
  try {
    make_dirs(save_dir);
  } catch (const InputError& e) {
    error = std::string("save_dir: ") + e.what();
  } catch (const std::exception& e) {
    error = std::string("save_dir: ") + e.what();
    input = false;
  }
  if (error.empty()) {
    struct stat st {};
    if (::stat(save_dir.c_str(), &st) != 0)
      note("cannot be opened", errno);
    else if (!S_ISDIR(st.st_mode))
      note("is not a directory", ENOTDIR);
  }
  if (error.empty()) {
    const std::string probe = save_dir + "/.kqlora-write-probe-" + std::to_string(comm.rank());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      note("cannot be written", errno);
    } else {
      const char byte = 0;
      const bool wrote = ::write(fd, &byte, 1) == 1;
      const int err = errno;
      ::close(fd);
      ::unlink(probe.c_str());
      if (!wrote) note("cannot be written", err);
    }
  }
  double codes[2] = {error.empty() ? 0.0 : 1.0, !error.empty() && !input ? 1.0 : 0.0};
  comm.wait(comm.allreduce_sum(codes, 2));
  if (codes[0] == 0) return;
  // Every rank stops with the same kind of error; only rank 0's message is printed, so a
  // failing rank other than 0 prints its own.
  if (!error.empty() && comm.rank() != 0)
    std::fprintf(stderr, "error on rank %d: %s\n", comm.rank(), error.c_str());
  const std::string what = !error.empty()
                               ? error
                               : save_dir + ": save_dir cannot be written on " +
                                     std::to_string(static_cast<int>(codes[0])) + " other rank(s)";
  if (codes[1] > 0) KQLORA_CHECK(false, what);
  KQLORA_INPUT_CHECK(false, what);
}

std::string commit_checkpoint(const std::string& save_dir, int64_t step, int64_t keep_last,
                              Communicator& comm,
                              const std::function<void(const std::string& tmp_dir)>& write) {
  const std::string name = step_dir_name(step);
  const std::string final_dir = save_dir + "/" + name, tmp_dir = final_dir + ".tmp";
  const bool root = comm.rank() == 0;
  bool failed = false;
  std::string error;
  if (root) {
    try {
      make_dirs(save_dir);
      remove_tree(tmp_dir);  // a leftover of an interrupted write
      make_dirs(tmp_dir);
    } catch (const std::exception& e) {
      failed = true;
      error = e.what();
    }
  }
  KQLORA_CHECK(
      !any_rank(comm, failed),
      "checkpoint " << tmp_dir << ": " << (error.empty() ? "rank 0 could not create it" : error));
  try {
    write(tmp_dir);
  } catch (const std::exception& e) {
    failed = true;
    error = e.what();
  }
  // A failed write leaves nothing behind (its space back, the previous checkpoint and
  // `latest` untouched).
  const bool any_failed = any_rank(comm, failed);
  if (any_failed && root) remove_tree(tmp_dir);
  KQLORA_CHECK(!any_failed, "checkpoint " << tmp_dir << ": writing failed"
                                          << (error.empty() ? " on another rank" : ": " + error));
  if (root) {
    fsync_path(tmp_dir, true);
    if (is_dir(final_dir)) remove_tree(final_dir);  // the same step written again (a rerun)
    KQLORA_CHECK(
        ::rename(tmp_dir.c_str(), final_dir.c_str()) == 0,
        "cannot rename " << tmp_dir << " to " << final_dir << ": " << std::strerror(errno));
    fsync_path(save_dir, true);
    const std::string latest = save_dir + "/latest", latest_tmp = latest + ".tmp";
    {
      std::ofstream l(latest_tmp, std::ios::trunc);
      l << name << "\n";
      KQLORA_CHECK(l.good(), "cannot write " << latest_tmp);
    }
    fsync_path(latest_tmp, false);
    KQLORA_CHECK(::rename(latest_tmp.c_str(), latest.c_str()) == 0,
                 "cannot replace " << latest << ": " << std::strerror(errno));
    fsync_path(save_dir, true);
    if (keep_last > 0) {
      auto steps = complete_steps(save_dir);
      // Only complete checkpoints older than the one just committed go.
      for (size_t i = 0; i + keep_last < steps.size(); ++i)
        if (steps[i] < name) remove_tree(save_dir + "/" + steps[i]);
    }
  }
  any_rank(comm, false);  // a barrier: no rank reads `latest` before it is there
  return final_dir;
}

std::string write_checkpoint_per_rank(const std::string& save_dir, const CheckpointContents& c,
                                      int64_t keep_last, Communicator& comm) {
  return commit_checkpoint(save_dir, c.step, keep_last, comm, [&](const std::string& tmp_dir) {
    char file[32];
    std::snprintf(file, sizeof file, "/rank-%05d.h5", c.rank);
    write_checkpoint_file(tmp_dir + file, c);
  });
}

namespace {

constexpr int64_t kMaxRanks = int64_t{1} << 24;  // a world_size beyond any machine

/// The step directory a save_dir's `latest` names: one line of letters, digits, '_', '-'
/// or '.' (kqlora writes step-NNNNNNNN), else InputError showing what it holds.
std::string read_latest(const std::string& latest_path) {
  std::ifstream f(latest_path, std::ios::binary);
  KQLORA_INPUT_CHECK(
      f.good(), latest_path << ": cannot read: " << std::strerror(errno) << " (a dangling link?)");
  std::string text(256, '\0');
  f.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const bool ok =
      !text.empty() && text != "." && text != ".." &&
      std::all_of(text.begin(), text.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
      });
  if (!ok) {
    std::string shown;  // printable, so a NUL or a control byte cannot cut the message
    for (char ch : text.substr(0, 64)) {
      if (std::isprint(static_cast<unsigned char>(ch))) {
        shown += ch;
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(ch));
        shown += hex;
      }
    }
    KQLORA_INPUT_CHECK(
        false, latest_path << ": does not name a step directory (it holds '" << shown << "')");
  }
  return text;
}

}  // namespace

std::vector<std::string> checkpoint_files(const std::string& path) {
  KQLORA_INPUT_CHECK(::access(path.c_str(), R_OK) == 0,
                     path << ": no such checkpoint file or directory");
  if (!is_dir(path)) return {path};
  std::string dir = path;
  const std::string latest_path = path + "/latest";
  struct stat st {};
  if (::lstat(latest_path.c_str(), &st) == 0) {  // a save_dir (even a dangling link counts)
    const std::string name = read_latest(latest_path);
    dir = path + "/" + name;
    KQLORA_INPUT_CHECK(
        is_dir(dir), latest_path << " names '" << name << "', which is not a step directory here");
  }
  if (::access((dir + "/checkpoint.h5").c_str(), R_OK) == 0) return {dir + "/checkpoint.h5"};
  std::vector<std::string> files;
  DIR* d = ::opendir(dir.c_str());
  KQLORA_INPUT_CHECK(d, dir << ": cannot list: " << std::strerror(errno));
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("rank-", 0) == 0 && n.size() > 8 && n.substr(n.size() - 3) == ".h5")
      files.push_back(dir + "/" + n);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  KQLORA_INPUT_CHECK(!files.empty(), dir << ": no checkpoint files (rank-*.h5 or checkpoint.h5)");
  return files;
}

namespace {
void validate_against_config(const CheckpointContents& c, const std::string& path);
}

CheckpointContents read_checkpoint_file(const std::string& path, bool with_optimizer,
                                        bool with_values) {
  h5::InputFileScope scope(path);
  auto f = h5::open_file(path);
  const std::string format = h5::read_string_attribute(f, "format", path);
  KQLORA_INPUT_CHECK(format == "kqlora-checkpoint",
                     path << ": not a kqlora checkpoint (format '" << format << "')");
  const auto version = h5::read_int_attribute(f, "format_version", path);
  KQLORA_INPUT_CHECK(version.size() == 1 && (version[0] == 1 || version[0] == 2),
                     path << ": format_version " << (version.empty() ? -1 : version[0])
                          << " is not supported (this kqlora reads versions 1 and 2)");
  CheckpointContents c;
  c.format_version = static_cast<int>(version[0]);
  // Version 2 promises checksummed metadata: a file whose format says otherwise was
  // rewritten by something else, and its metadata cannot be trusted.
  KQLORA_INPUT_CHECK(c.format_version == 1 || h5::metadata_checksummed(f),
                     path << ": format_version 2, but its HDF5 metadata is not checksummed "
                             "(superblock of the older format): rewritten by another tool?");
  c.step = h5::read_int64_attribute(f, "step", path);
  KQLORA_INPUT_CHECK(c.step >= 0, path << ": step " << c.step << " is negative");
  const int64_t world = h5::read_int64_attribute(f, "world_size", path);
  KQLORA_INPUT_CHECK(world >= 1 && world <= kMaxRanks, path << ": world_size " << world
                                                            << " is out of range (1.." << kMaxRanks
                                                            << ")");
  c.world_size = static_cast<int>(world);
  c.parallel = h5::read_string_attribute(f, "parallel", path);
  KQLORA_INPUT_CHECK(c.parallel == "ddp" || c.parallel == "fsdp",
                     path << ": parallel '" << c.parallel << "' is neither ddp nor fsdp");
  c.layout = h5::read_string_attribute(f, "layout", path);
  KQLORA_INPUT_CHECK(c.layout == "per_rank" || c.layout == "shared",
                     path << ": layout '" << c.layout << "' is neither per_rank nor shared");
  if (c.layout == "per_rank") {
    const int64_t rank = h5::read_int64_attribute(f, "rank", path);
    KQLORA_INPUT_CHECK(rank >= 0 && rank < world,
                       path << ": rank " << rank << " is out of range for world_size " << world);
    c.rank = static_cast<int>(rank);
  }
  c.config_text = h5::read_string_attribute(f, "config", path);
  c.model_config_text = h5::has_attribute(f, "model_config")
                            ? h5::read_string_attribute(f, "model_config", path)
                            : c.config_text;
  ModelConfig model = ModelConfig::from_text(c.model_config_text, path + " (model_config)");
  if (h5::has_attribute(f, "hf_config")) {
    c.arch_text = model.arch_text = h5::read_string_attribute(f, "hf_config", path);
    model.arch_source = path + " (hf_config)";
  }
  if (h5::has_attribute(f, "base_hash"))
    c.base_hash = h5::read_string_attribute(f, "base_hash", path);
  if (h5::has_attribute(f, "reference_hash"))
    c.reference_hash = h5::read_string_attribute(f, "reference_hash", path);
  const auto kinds = model_kinds();
  KQLORA_INPUT_CHECK(std::find(kinds.begin(), kinds.end(), model.kind) != kinds.end(),
                     path << ": model '" << model.kind << "' is not a model this kqlora knows");
  c.table = model_table(model);
  KQLORA_INPUT_CHECK(h5::exists(f, "params"), path << ": group /params is missing");
  auto params = h5::open_group(f, "params");
  std::vector<std::string> names;
  for (const auto& d : h5::list_datasets(params)) {
    const auto slash = d.find('/');
    const std::string top = slash == std::string::npos ? d : d.substr(0, slash);
    if (names.empty() || names.back() != top) names.push_back(top);
  }
  for (const auto& name : names) {
    if (h5::is_nf4_shard_group(params, name)) {
      c.nf4_shards.emplace_back(name, h5::read_nf4_shard(params, name, path));
      continue;
    }
    if (h5::is_nf4_group(params, name)) {
      c.nf4.emplace_back(name, h5::read_nf4(params, name, path));
      continue;
    }
    CheckpointTensor t;
    t.name = name;
    t.shape = h5::dataset_dims(params, name, path);
    // Sized by the config before anything is allocated (a crafted shape is refused, not
    // allocated): a tensor or its FSDP slice holds at most the config's element count.
    const ParamEntry* entry = c.table.find(name);
    KQLORA_INPUT_CHECK(entry && entry->kind != ParamKind::nf4,
                       path << ": /params/" << name << " is not a parameter of this model");
    const int64_t stored = checked_numel(t.shape, path + ": /params/" + name);
    KQLORA_INPUT_CHECK(stored <= std::max<int64_t>(entry->numel(), 1),
                       path << ": /params/" << name << " holds " << stored
                            << " elements, more than the config's " << entry->numel());
    H5T_class_t cls;
    size_t size;
    h5::dataset_type(params, name, &cls, &size);
    KQLORA_INPUT_CHECK(cls == H5T_FLOAT, path << ": /params/" << name << " is not a float dataset");
    KQLORA_INPUT_CHECK(size == 4 || size == 2, path << ": /params/" << name << " has " << size
                                                    << "-byte floats (float32 or "
                                                    << "bfloat16 expected)");
    const int64_t n = stored;
    if (with_values) {
      t.data.resize(static_cast<size_t>(n));
      h5::read_dataset(params, name, H5T_NATIVE_FLOAT, n, t.data.data(),
                       path + ": /params/" + name);
    }
    h5::Handle d(KQLORA_H5(H5Dopen2(params, name.c_str(), H5P_DEFAULT)));
    if (h5::has_attribute(d, "first_element")) {  // an FSDP slice
      const std::string where = path + ": /params/" + name;
      t.first_element = h5::read_int64_attribute(d, "first_element", where);
      t.global_shape = h5::read_int_attribute(d, "global_shape", where);
      KQLORA_INPUT_CHECK(t.global_shape == entry->shape,
                         where << ": global_shape " << h5::shape_text(t.global_shape)
                               << ", the config says " << h5::shape_text(entry->shape));
      const int64_t shard = h5::read_int64_attribute(d, "shard_index", where);
      const int64_t shards = h5::read_int64_attribute(d, "num_shards", where);
      KQLORA_INPUT_CHECK(
          shards == world && shard >= 0 && shard < shards,
          where << ": shard " << shard << " of " << shards << " in a run of " << world << " ranks");
      t.shard_index = static_cast<int>(shard);
      t.num_shards = static_cast<int>(shards);
      const int64_t real = h5::read_int64_attribute(d, "num_elements", where);
      KQLORA_INPUT_CHECK(real >= 0 && real <= n,
                         where << ": num_elements " << real << " out of range");
      // (Compared without overflow: both are at most the config's element count.)
      KQLORA_INPUT_CHECK(t.first_element >= 0 && t.first_element <= entry->numel() &&
                             real <= entry->numel() - t.first_element,
                         where << ": elements [" << t.first_element << ", +" << real
                               << ") lie outside the tensor's " << entry->numel());
      if (with_values) t.data.resize(static_cast<size_t>(real));
      t.shape = {real};
    }
    c.params.push_back(std::move(t));
  }
  validate_against_config(c, path);
  // The optimizer state is validated even when it is not wanted (kqlora-diff without
  // --optimizer): a damaged file is refused whatever is compared.
  if (h5::exists(f, "optimizer")) {
    auto opt = h5::open_group(f, "optimizer");
    c.optimizer_steps = h5::read_int64_attribute(opt, "step", path + ": /optimizer");
    // A parameter's stored element count: its optimizer state must have as many.
    std::map<std::string, int64_t> count;
    for (const auto& t : c.params)
      count[t.name] = t.first_element >= 0 ? t.shape.at(0) : checked_numel(t.shape, path);
    for (const auto& d : h5::list_datasets(opt)) {
      const auto slash = d.rfind('/');
      KQLORA_INPUT_CHECK(slash != std::string::npos,
                         path << ": /optimizer/" << d << " is not <param>/<state>");
      const auto it = count.find(d.substr(0, slash));
      KQLORA_INPUT_CHECK(it != count.end(), path << ": /optimizer/" << d
                                                 << " is the state of no parameter in /params");
      const int64_t n = checked_numel(h5::dataset_dims(opt, d, path), path + ": /optimizer/" + d);
      KQLORA_INPUT_CHECK(n == it->second, path << ": /optimizer/" << d << " has " << n
                                               << " elements, its parameter " << it->second);
      H5T_class_t cls;
      size_t size;
      h5::dataset_type(opt, d, &cls, &size);
      KQLORA_INPUT_CHECK(cls == H5T_FLOAT && size == 4,
                         path << ": /optimizer/" << d << " is not a float32 dataset");
      if (!with_optimizer) continue;
      std::vector<float> v(with_values ? static_cast<size_t>(n) : 0);
      if (with_values)
        h5::read_dataset(opt, d, H5T_NATIVE_FLOAT, n, v.data(), path + ": /optimizer/" + d);
      c.optimizer.push_back({{d.substr(0, slash), d.substr(slash + 1)}, std::move(v)});
    }
  }
  // The run's seed and data position: a restart continues from them, so a changed byte
  // must not pass. (A shared file's are in it; rank files each hold their own.)
  c.seed = h5::read_int64_dataset(f, "rng/seed", path);
  KQLORA_INPUT_CHECK(
      static_cast<uint64_t>(c.seed) == model.seed,
      path << ": /rng/seed " << c.seed << " differs from the config's seed " << model.seed);
  const int64_t next = h5::read_int64_dataset(f, "data/next_step", path);
  KQLORA_INPUT_CHECK(next == c.step, path << ": /data/next_step " << next
                                          << " differs from the step attribute " << c.step);
  return c;
}

namespace {

/// The objects the checkpoint's parameter table says it holds, with their shapes and NF4
/// layouts: refuses a file that misses one or holds it in another shape (a damaged or
/// foreign file).
void validate_against_config(const CheckpointContents& c, const std::string& path) {
  const ParamTable& table = c.table;
  const bool base = c.base_hash.empty();  // (auto: the file holds no frozen tensor)
  for (const ParamEntry* e : table.of_kind(ParamKind::nf4)) {
    if (!base) break;
    const Nf4Layout L = e->nf4_layout();
    bool found = false;
    for (const auto& [name, t] : c.nf4) {
      if (name != e->name) continue;
      found = true;
      KQLORA_INPUT_CHECK(t.layout == L, path << ": /params/" << name << " is NF4 "
                                             << t.layout.shape_string() << " "
                                             << dtype_name(t.layout.dtype) << ", the config says "
                                             << L.shape_string() << " " << dtype_name(L.dtype));
    }
    for (const auto& [name, s] : c.nf4_shards) {
      if (name != e->name) continue;
      found = true;
      KQLORA_INPUT_CHECK(s.global == L, path << ": NF4 shard /params/" << name
                                             << " does not match the config's layout");
    }
    KQLORA_INPUT_CHECK(found, path << ": /params/" << e->name << " (NF4) is missing");
  }
  const bool sharded = !c.nf4_shards.empty() || (c.parallel == "fsdp" && c.layout == "per_rank");
  for (const auto& t : c.params) {
    const ParamEntry* e = table.find(t.name);
    KQLORA_INPUT_CHECK(e && e->kind != ParamKind::nf4 && (base || e->kind != ParamKind::dense),
                       path << ": /params/" << t.name << " is not a parameter of this model"
                            << (base ? "" : " (or is frozen, in a file with base_hash)"));
    const auto& shape = t.first_element >= 0 ? t.global_shape : t.shape;
    KQLORA_INPUT_CHECK(shape == e->shape, path << ": /params/" << t.name << " has shape "
                                               << h5::shape_text(shape) << ", expected "
                                               << h5::shape_text(e->shape));
  }
  if (!sharded) {  // a whole checkpoint has every float tensor
    for (const auto& e : table.entries) {
      if (e.kind == ParamKind::nf4 || (!base && e.kind == ParamKind::dense)) continue;
      bool found = false;
      for (const auto& t : c.params) found |= t.name == e.name;
      KQLORA_INPUT_CHECK(found, path << ": /params/" << e.name << " is missing");
    }
  }
}

}  // namespace

CheckpointContents assemble_checkpoint(const std::vector<CheckpointContents>& parts,
                                       const std::string& where) {
  KQLORA_INPUT_CHECK(!parts.empty(), where << ": no checkpoint files");
  const CheckpointContents& first = parts.front();
  const bool sharded = !first.nf4_shards.empty() ||
                       std::any_of(first.params.begin(), first.params.end(),
                                   [](const CheckpointTensor& t) { return t.first_element >= 0; });
  for (const auto& p : parts)
    KQLORA_INPUT_CHECK(p.step == first.step && p.world_size == first.world_size,
                       where << ": files of different steps or runs (step " << p.step << " vs "
                             << first.step << ")");
  if (!sharded) return first;  // DDP: every rank's file holds the whole state
  KQLORA_INPUT_CHECK(static_cast<int>(parts.size()) == first.world_size,
                     where << ": " << parts.size() << " files for an FSDP run of "
                           << first.world_size << " ranks (a rank's file is missing)");
  CheckpointContents whole = first;
  whole.nf4_shards.clear();
  whole.params.clear();
  whole.optimizer.clear();
  whole.layout = "per_rank";
  // NF4: gather each tensor's shards.
  std::map<std::string, std::vector<Nf4Shard<Kokkos::HostSpace>>> shards;
  std::vector<std::string> order;
  for (const auto& p : parts)
    for (const auto& [name, s] : p.nf4_shards) {
      if (!shards.count(name)) order.push_back(name);
      shards[name].push_back(s);
    }
  for (const auto& name : order)
    whole.nf4.emplace_back(name, nf4_gather(Kokkos::DefaultHostExecutionSpace(), shards[name]));
  // Parameters and their optimizer state: slices of the flattened tensors.
  struct Assembly {
    std::vector<int64_t> shape;
    std::vector<float> data;
    std::vector<char> seen;
    std::map<std::string, std::vector<float>> state;
  };
  std::map<std::string, Assembly> params;
  std::vector<std::string> porder;
  for (const auto& p : parts) {
    KQLORA_INPUT_CHECK(p.model_config_text == first.model_config_text,
                       where << ": files of different models (their model configurations differ)");
    std::map<std::string, std::pair<int64_t, int64_t>> slice_of;  // first element, count
    for (const auto& t : p.params) {
      KQLORA_INPUT_CHECK(t.first_element >= 0, where << ": parameter '" << t.name
                                                     << "' is whole in a sharded checkpoint");
      const int64_t numel = checked_numel(t.global_shape, where + ": '" + t.name + "'");
      auto& a = params[t.name];
      if (a.data.empty() && a.seen.empty()) {
        porder.push_back(t.name);
        a.shape = t.global_shape;
        a.data.assign(static_cast<size_t>(numel), 0.0f);
        a.seen.assign(static_cast<size_t>(numel), 0);
      }
      KQLORA_INPUT_CHECK(t.global_shape == a.shape,
                         where << ": the slices of '" << t.name << "' disagree on its shape ("
                               << h5::shape_text(t.global_shape) << " and "
                               << h5::shape_text(a.shape) << ")");
      const int64_t count = static_cast<int64_t>(t.data.size());
      KQLORA_INPUT_CHECK(t.first_element <= numel && count <= numel - t.first_element,
                         where << ": a slice of '" << t.name << "' lies outside it");
      for (size_t i = 0; i < t.data.size(); ++i) {
        KQLORA_INPUT_CHECK(!a.seen[t.first_element + i]++,
                           where << ": slices of '" << t.name << "' overlap");
        a.data[t.first_element + i] = t.data[i];
      }
      slice_of[t.name] = {t.first_element, count};
    }
    for (const auto& [key, v] : p.optimizer) {
      const auto it = slice_of.find(key.first);
      KQLORA_INPUT_CHECK(it != slice_of.end(), where << ": optimizer state of '" << key.first
                                                     << "' without its parameter slice");
      KQLORA_INPUT_CHECK(static_cast<int64_t>(v.size()) == it->second.second,
                         where << ": optimizer state " << key.second << " of '" << key.first
                               << "' holds " << v.size() << " values for a slice of "
                               << it->second.second);
      auto& a = params[key.first];
      auto& st = a.state[key.second];
      if (st.empty()) st.assign(a.data.size(), 0.0f);
      std::copy(v.begin(), v.end(), st.begin() + it->second.first);
    }
  }
  for (const auto& name : porder) {
    auto& a = params[name];
    KQLORA_INPUT_CHECK(std::all_of(a.seen.begin(), a.seen.end(), [](char c) { return c == 1; }),
                       where << ": the slices of '" << name << "' do not cover it");
    whole.params.push_back({name, a.shape, a.data});
    for (auto& [state, v] : a.state) whole.optimizer.push_back({{name, state}, v});
  }
  return whole;
}

}  // namespace kqlora
