// File names on the command line: the format follows the extension.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "attn/file.hpp"

namespace attn::cli {

// ".PNG" and ".png" alike: "x/out.PNG" -> ".png".
inline std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// The format an output is written in: its extension (".PNG" as ".png") when
// that is one of `formats`; for a device or FIFO (/dev/stdout, a pipe, also
// through a link), which has no name to say it, the first of them; else ""
// (a usage error).
inline std::string output_format(const std::string& path, const std::vector<std::string>& formats) {
  const std::string ext = lower_extension(path);
  if (std::find(formats.begin(), formats.end(), ext) != formats.end()) return ext;
  struct stat target;
  if (::stat(path.c_str(), &target) == 0 && !S_ISREG(target.st_mode) && !S_ISDIR(target.st_mode)) return formats.front();
  return "";
}

// Creates `folder` (and its parents) unless it exists; IOError naming the
// command otherwise.
inline void make_folder(const std::string& folder, const std::string& command) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error)
    throw IOError(command + ": cannot create the folder '" + folder + "': " + error.message());
}

// Sends what the command printed so far on its way, and checks that every
// write to standard output succeeded (a full disk, a closed descriptor):
// IOError otherwise, as coreutils' close_stdout reports it.
inline void flush_standard_output() {
  if (std::fflush(stdout) != 0) throw IOError(std::string("standard output: write error: ") + std::strerror(errno));
  if (std::ferror(stdout)) throw IOError("standard output: write error");
}

// The files a command writes, all at its end: none is replaced unless every
// one, and what the command printed, was written (attn::FileSet).
class Outputs {
 public:
  void add(const std::string& path, std::string bytes) { files_.add(path, std::move(bytes)); }
  void write() { files_.write(flush_standard_output); }

 private:
  FileSet files_;
};

}  // namespace attn::cli
