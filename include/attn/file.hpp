// Writing files so that nothing is lost: every file attn writes (.npy,
// safetensors, PNG, SVG, the CLI's CSV) goes through write_file.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "attn/error.hpp"

namespace attn {

// A file could not be opened, read or written (Python: OSError).
class IOError : public Error {
 public:
  using Error::Error;
};

// Writes the concatenation of `parts` to `path`.
//
// A regular file, or a path that does not exist yet, is replaced whole or not
// at all: the bytes go to a temporary file beside the target (symbolic links
// followed, so the link stays a link), which is flushed to disk and renamed
// over the target only when every write succeeded. An existing file keeps
// its permission bits; a new one gets those the umask gives. After a failure
// no temporary file is left and the old content is untouched.
//
// Anything else that exists (a terminal, pipe, FIFO or device such as
// /dev/stdout or /dev/full) cannot be replaced, so it is written in place.
//
// Either way every write and the close are checked: a failure is an IOError
// naming `path` and the system's reason.
void write_file(const std::string& path, std::initializer_list<std::string_view> parts);

}  // namespace attn
