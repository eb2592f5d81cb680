// File names on the command line: the format follows the extension.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <system_error>

#include "attn/file.hpp"

namespace attn::cli {

// ".PNG" and ".png" alike: "x/out.PNG" -> ".png".
inline std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// Creates `folder` (and its parents) unless it exists; IOError naming the
// command otherwise.
inline void make_folder(const std::string& folder, const std::string& command) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error)
    throw IOError(command + ": cannot create the folder '" + folder + "': " + error.message());
}

}  // namespace attn::cli
