#include "kqlora/core/output_guard.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace fs = std::filesystem;

namespace {

/// The path a write to `p` touches: its folders resolved on disk as the kernel does --
/// links first, then "..", so "link/../x" is beside the link's target, not beside the
/// link -- and its last part kept as written (a `latest` link is the link).
fs::path written(const std::string& p) {
  fs::path a = fs::absolute(p);
  while (a.has_parent_path() && a.filename().empty()) a = a.parent_path();  // trailing '/'
  const std::string last = a.filename().string();
  if (last == "." || last == "..") return fs::weakly_canonical(a);
  return fs::weakly_canonical(a.parent_path()) / a.filename();
}

/// `p` is `dir` or lies below it (both normalised).
bool within(const fs::path& p, const fs::path& dir) {
  const auto [d, o] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return d == dir.end();
}

struct Id {
  dev_t dev = 0;
  ino_t ino = 0;
  bool dir = false;
  bool operator==(const Id& o) const { return dev == o.dev && ino == o.ino; }
};

bool id_of(const fs::path& p, Id* id) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  *id = {st.st_dev, st.st_ino, S_ISDIR(st.st_mode)};
  return true;
}

/// The identities of `p` (when it exists) and of every existing folder above it.
std::vector<Id> id_chain(const fs::path& p) {
  std::vector<Id> ids;
  for (fs::path q = fs::weakly_canonical(p);; q = q.parent_path()) {
    Id id;
    if (id_of(q, &id)) ids.push_back(id);
    if (q == q.root_path() || q.empty()) break;
  }
  return ids;
}

}  // namespace

std::string written_path(const std::string& p) {
  return written(p).string();
}

void refuse_output_over_inputs(const std::string& option, const std::string& out,
                               const std::vector<WriterInput>& inputs, bool may_contain) {
  KQLORA_INPUT_CHECK(!out.empty(), option << ": an empty path");
  const fs::path ow = written(out), orr = fs::weakly_canonical(ow);
  Id oid;
  const bool o_exists = id_of(orr, &oid);
  const std::vector<Id> o_chain = id_chain(ow);
  for (const auto& [in, what] : inputs) {
    if (in.empty()) continue;
    const fs::path iw = written(in), ir = fs::weakly_canonical(iw);
    Id iid;
    const bool i_exists = id_of(ir, &iid);
    KQLORA_INPUT_CHECK(ow != iw && ow != ir && orr != ir && !(o_exists && i_exists && oid == iid),
                       option << " " << out << " is " << what << " " << in
                              << ": writing it would destroy an input");
    if (!i_exists) continue;
    const bool inside =
        iid.dir && (within(ow, ir) || within(orr, ir) ||
                    std::find(o_chain.begin(), o_chain.end(), iid) != o_chain.end());
    KQLORA_INPUT_CHECK(!inside, option << " " << out << " is inside " << what << " " << in
                                       << ": writing it would change an input");
    // (A hard link elsewhere to a file of an input directory: the same file.)
    if (iid.dir && o_exists && !oid.dir) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(ir, ec)) {
        Id fid;
        KQLORA_INPUT_CHECK(!(id_of(e.path(), &fid) && fid == oid),
                           option << " " << out << " is " << e.path().string() << " of " << what
                                  << " " << in
                                  << " (a link to it): writing it would destroy an input");
      }
    }
    if (may_contain || !o_exists || !oid.dir) continue;
    const std::vector<Id> i_chain = id_chain(iw);
    const bool contains = within(iw, ow) || within(ir, orr) ||
                          std::find(i_chain.begin(), i_chain.end(), oid) != i_chain.end();
    KQLORA_INPUT_CHECK(!contains, option << " " << out << " contains " << what << " " << in
                                         << ": replacing it would destroy an input");
  }
}

void check_file_output(const std::string& option, const std::string& out) {
  KQLORA_INPUT_CHECK(!out.empty(), option << ": an empty path");
  struct stat st {};
  KQLORA_INPUT_CHECK(::stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode),
                     option << " " << out << " is an existing directory; a file is expected");
  const fs::path dir = written(out).parent_path();
  KQLORA_INPUT_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
                     option << " " << out << ": its folder " << dir.string() << " does not exist");
}

}  // namespace kqlora
