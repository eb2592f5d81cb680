#include "picture/xml_text.hpp"

#include <cstdint>
#include <cstdio>

#include "attn/error.hpp"

namespace attn::detail {
namespace {

// The text for an error message: bytes outside printable ASCII as \xNN.
std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

}  // namespace

void check_xml_text(const std::string& what, const std::string& s) {
  const auto bytes = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = bytes[i];
    const int extra = b < 0x80 ? 0 : (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2 : (b & 0xF8) == 0xF0 ? 3 : -1;
    uint32_t cp = extra == 0 ? b : extra == 1 ? b & 0x1Fu : extra == 2 ? b & 0x0Fu : b & 0x07u;
    bool ok = extra >= 0;
    for (int k = 1; ok && k <= extra; ++k) {
      ok = i + static_cast<size_t>(k) < s.size() && (bytes[i + k] & 0xC0) == 0x80;
      if (ok) cp = (cp << 6) | (bytes[i + k] & 0x3Fu);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
    ok = ok && !(extra == 1 && cp < 0x80) && !(extra == 2 && cp < 0x800) && !(extra == 3 && cp < 0x10000) &&
         !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
    if (!ok)
      throw ValueError("write_svg: " + what + " '" + shown(s) + "' is not valid UTF-8 (at byte " + std::to_string(i) +
                       "); SVG is XML, which holds UTF-8 text only");
    const bool allowed = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                         (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
    if (!allowed) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
      throw ValueError("write_svg: " + what + " '" + shown(s) + "' holds " + code +
                       ", a character XML cannot hold (SVG is XML); write a .png, or leave it out");
    }
    i += static_cast<size_t>(extra) + 1;
  }
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\t': out += "&#9;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      default: out += c;
    }
  return out;
}

}  // namespace attn::detail
