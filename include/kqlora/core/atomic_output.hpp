#pragma once
// Outputs appear whole or not at all (docs/RELIABILITY.md, "Writers"): a file is written
// under a temporary name in its own directory and renamed over the output at the end; a
// directory output is written whole beside it and swapped in. A full disk, an I/O error or
// a kill leaves the previous output at that path as it was.

#include <functional>
#include <string>

namespace kqlora {

/// A file output: write to temp(), then commit(). Uncommitted, the temporary is removed.
class FileOutput {
 public:
  /// The temporary is `.<name>.tmp-<pid>-<n>` beside `path`, created new (an existing file
  /// of that name is never truncated).
  explicit FileOutput(std::string path);
  ~FileOutput();
  FileOutput(const FileOutput&) = delete;
  FileOutput& operator=(const FileOutput&) = delete;

  const std::string& temp() const { return temp_; }
  const std::string& path() const { return path_; }
  /// Flushes the temporary to disk and renames it over path() (Error, exit 1, on failure).
  void commit();

 private:
  std::string path_, temp_;
  bool done_ = false;
};

/// A directory output: write its files into temp(), then commit() swaps it in for `path`.
class DirectoryOutput {
 public:
  /// InputError (before any work) when `path` exists and is not a directory, or holds an
  /// entry `own` does not accept (a previous output of the same kind holds only its own
  /// names, and no subdirectories). An empty directory is accepted.
  DirectoryOutput(const std::string& option, std::string path,
                  const std::function<bool(const std::string&)>& own);
  /// The constructor's check alone (nothing created): to refuse before a long read.
  static void check(const std::string& option, const std::string& path,
                    const std::function<bool(const std::string&)>& own);
  ~DirectoryOutput();
  DirectoryOutput(const DirectoryOutput&) = delete;
  DirectoryOutput& operator=(const DirectoryOutput&) = delete;

  const std::string& temp() const { return temp_; }
  const std::string& path() const { return path_; }
  /// Swaps temp() in for path() (atomically where the kernel can exchange two names) and
  /// removes the previous output (Error, exit 1, on failure).
  void commit();

 private:
  std::string path_, temp_;
  bool done_ = false;
};

}  // namespace kqlora
