// File names on the command line: the format follows the extension.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>

namespace attn::cli {

// ".PNG" and ".png" alike: "x/out.PNG" -> ".png".
inline std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

}  // namespace attn::cli
