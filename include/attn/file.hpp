// Writing files so that nothing is lost: every file attn writes (.npy,
// safetensors, PNG, SVG, the CLI's CSV) goes through a FileSet.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attn/error.hpp"

namespace attn {

// A file could not be opened, read or written (Python: OSError, of the
// subclass its errno names, such as FileNotFoundError).
class IOError : public Error {
 public:
  using Error::Error;
  // "<path>: <what>: <the system's reason>", keeping errno and the path.
  IOError(const std::string& path, const std::string& what, int error_number);
  int error_number() const { return error_number_; }  // 0: not the system's error
  const std::string& path() const { return path_; }
  const std::string& what_failed() const { return what_failed_; }

 private:
  int error_number_ = 0;
  std::string path_, what_failed_;
};

// Files written together: all of them, or (up to the final renames) none.
//
// A regular file, or a path that does not exist yet, is replaced whole: its
// bytes go to a temporary file beside the target (symbolic links followed,
// so a link stays a link), flushed to disk, renamed over the target only
// when every file of the set was written. An existing file keeps its
// permission bits (a new one gets those the umask gives), and one the caller
// may not write (mode 444 for a user who is not root) is refused, as cp
// refuses it, not replaced.
//
// Anything else that exists (a terminal, pipe, FIFO or device such as
// /dev/stdout or /dev/full, directly or through a link) cannot be replaced,
// so it is written in place, after the temporary files and before the
// renames.
//
// Every write and close is checked: a failure is an IOError naming the path
// and the system's reason, after which no temporary file is left and no
// target that can be replaced has changed.
class FileSet {
 public:
  // `path` gets the concatenation of `parts`, which must stay alive until
  // write() returns.
  void add(const std::string& path, std::initializer_list<std::string_view> parts);
  // `path` gets `bytes`, which the set keeps.
  void add(const std::string& path, std::string bytes);
  bool empty() const { return files_.empty(); }

  // Writes every file as above. `before_replacing`, when given, runs once
  // every file is written and before any is replaced: what it throws leaves
  // the targets as they were (the CLI checks standard output there).
  void write(const std::function<void()>& before_replacing = {});

 private:
  struct File {
    std::string path;
    std::unique_ptr<std::string> bytes;  // owned, when added as bytes
    std::vector<std::string_view> parts;
  };
  std::vector<File> files_;
};

// One file, written as a FileSet of one.
void write_file(const std::string& path, std::initializer_list<std::string_view> parts);

}  // namespace attn
