// How `attn attend --pe` and `attn demo` put word positions into the vectors
// before multi_head: not at all, the sinusoidal table added, or RoPE
// applied to each head's slice.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "attn/multi_head.hpp"
#include "attn/positional.hpp"

namespace attn::cli {

enum class PositionalEncoding { None, Sinusoidal, Rope };

inline const std::map<std::string, PositionalEncoding> kPositionalEncodings{
    {"none", PositionalEncoding::None},
    {"sinusoidal", PositionalEncoding::Sinusoidal},
    {"rope", PositionalEncoding::Rope}};

// How picture titles name an encoding.
inline std::string encoding_title(PositionalEncoding encoding) {
  switch (encoding) {
    case PositionalEncoding::None:
      return "no positions";
    case PositionalEncoding::Sinusoidal:
      return "sinusoidal";
    case PositionalEncoding::Rope:
      return "RoPE";
  }
  return "";
}

// x (..., n, d) with positions 0..n-1 encoded, as a `heads`-head model sees them.
template <class T>
Tensor<T> with_positions(Tensor<T> x, PositionalEncoding encoding, int64_t heads) {
  switch (encoding) {
    case PositionalEncoding::None:
      return x;
    case PositionalEncoding::Sinusoidal: {
      const auto table = sinusoidal_encoding<T>(x.dim(-2), x.dim(-1));  // added to each (n, d)
      for (int64_t i = 0; i < x.numel(); ++i) x[i] += table[i % table.numel()];
      return x;
    }
    case PositionalEncoding::Rope:
      return apply_rope_per_head(x.view(), heads);
  }
  return x;
}

}  // namespace attn::cli
