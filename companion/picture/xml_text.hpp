// Internal to the picture room: text as an SVG file (XML) holds it.
#pragma once

#include <string>

namespace attn::detail {

// SVG is XML, whose text is UTF-8 of the characters XML 1.0 allows: tab, line
// feed, carriage return, U+0020 to U+D7FF, U+E000 to U+FFFD and U+10000 to
// U+10FFFF. A text with a malformed byte sequence, or with another control
// character (no escape can hold one), is a ValueError naming it (`what`,
// e.g. "row label 2 of heat map 0"); a file no XML parser reads is never
// written.
void check_xml_text(const std::string& what, const std::string& text);

// Text check_xml_text accepted, escaped for an element or an attribute (tab,
// line feed and carriage return as references, so that a parser keeps them
// as they are).
std::string xml_escape(const std::string& text);

}  // namespace attn::detail
