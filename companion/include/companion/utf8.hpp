// UTF-8 text as code points: the pictures' labels (PNG text) and the web
// page's sentences read it the same way.
#pragma once

#include <string>
#include <vector>

namespace attn {

// The code points of UTF-8 text into out; false for malformed text (a byte
// that starts no sequence, or a sequence cut short).
bool decode_utf8(const std::string& text, std::vector<char32_t>& out);

}  // namespace attn
