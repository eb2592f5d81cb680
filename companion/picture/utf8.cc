#include "companion/utf8.hpp"

namespace attn {

bool decode_utf8(const std::string& s, std::vector<char32_t>& out) {
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80           ? 0
                      : (c >> 5) == 0x6  ? 1
                      : (c >> 4) == 0xE  ? 2
                      : (c >> 3) == 0x1E ? 3
                                         : -1;
    if (extra < 0 || i + extra >= s.size()) return false;
    char32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += 1 + extra;
  }
  return true;
}

}  // namespace attn
