// The page's bindings (make web): what web/app.js and web/worker.js call,
// through embind. Every number the page shows comes from here, that is from
// attn's own multi_head, positional encodings, colour maps and trainer. Each
// call takes and returns JSON text: {"error": message} for bad input (an
// attn error included), so the page shows the message instead of losing the
// module.
#include <emscripten/bind.h>
#include <emscripten/val.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/attn.hpp"
#include "companion/experiments.hpp"
#include "companion/picture.hpp"
#include "companion/utf8.hpp"

namespace {

using nlohmann::json;

// The page's model dimension: 16, so that 8 heads keep slices of 2, which
// RoPE's pairs need.
constexpr int64_t kDim = 16;
// Longer sentences are refused: the page recomputes on every keystroke, and
// its maps stay readable.
constexpr int64_t kMaxTokens = 64;

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

bool is_space(char32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x3000; }
// CJK ideographs (the unified blocks and their extensions, compatibility
// ideographs): a token each, as the article splits 猫咬狗.
bool is_ideograph(char32_t c) {
  return (c >= 0x3400 && c <= 0x9FFF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x20000 && c <= 0x3134F);
}
// Pictographs and their joiners: emoji, dingbats, symbols.
bool is_pictograph(char32_t c) {
  return (c >= 0x1F000 && c <= 0x1FAFF) || (c >= 0x2600 && c <= 0x27BF) || c == 0x200D || c == 0xFE0F;
}

// A sentence as tokens: Chinese split by character, other text by spaces.
std::vector<std::string> tokenize(const std::string& text, const std::string& what) {
  std::vector<std::string> tokens;
  std::string word;
  const auto flush = [&] {
    if (!word.empty()) tokens.push_back(word);
    word.clear();
  };
  std::vector<char32_t> code_points;
  if (!attn::decode_utf8(text, code_points)) throw attn::ValueError(what + " is not UTF-8 text");
  for (const char32_t c : code_points) {
    if (is_pictograph(c))
      throw attn::ValueError(what + ": " + utf8(c) + " is an emoji or symbol; type words (Chinese, or words between spaces)");
    if (is_space(c)) {
      flush();
    } else if (is_ideograph(c)) {
      flush();
      tokens.push_back(utf8(c));
    } else {
      word += utf8(c);
    }
  }
  flush();
  if (tokens.empty()) throw attn::ValueError(what + " is empty: type a few words, e.g. 猫 咬 狗");
  if (static_cast<int64_t>(tokens.size()) > kMaxTokens)
    throw attn::ValueError(what + " has " + std::to_string(tokens.size()) + " tokens; the page takes at most " +
                           std::to_string(kMaxTokens));
  return tokens;
}

// A token's fixed vector: kDim values in [0, 1), SplitMix64's outputs from
// the FNV-1a hash of its UTF-8 bytes, each cut to 24 bits so that float32
// holds it exactly (tests/web/expected.py computes the same).
std::vector<float> token_vector(const std::string& token) {
  uint64_t state = 0xcbf29ce484222325ull;
  for (const char byte : token) state = (state ^ static_cast<unsigned char>(byte)) * 0x100000001b3ull;
  std::vector<float> v(kDim);
  for (auto& x : v) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x = static_cast<float>(z >> 40) * 0x1p-24f;
  }
  return v;
}

// Tensor (dims...) as nested JSON arrays.
json nested(const attn::Tensor<float>& t) {
  const auto build = [&](const auto& self, int64_t dim, int64_t offset) -> json {
    json a = json::array();
    int64_t stride = 1;
    for (int64_t k = dim + 1; k < t.rank(); ++k) stride *= t.dim(static_cast<int>(k));
    for (int64_t i = 0; i < t.dim(static_cast<int>(dim)); ++i)
      a.push_back(dim + 1 == t.rank() ? json(t[offset + i]) : self(self, dim + 1, offset + i * stride));
    return a;
  };
  return build(build, 0, 0);
}

// One sentence through multi_head with the chosen encoding: its tokens, the
// outputs and every head's weights (heads, n, n).
struct Sentence {
  std::vector<std::string> tokens;
  attn::Tensor<float> out, weights;
};

Sentence run_sentence(const std::string& text, const std::string& what, int64_t heads, const std::string& encoding) {
  Sentence s;
  s.tokens = tokenize(text, what);
  const auto n = static_cast<int64_t>(s.tokens.size());
  attn::Tensor<float> x({n, kDim});
  for (int64_t t = 0; t < n; ++t) {
    const auto v = token_vector(s.tokens[t]);
    for (int64_t c = 0; c < kDim; ++c) x[t * kDim + c] = v[c];
  }
  attn::AttentionOptions options;
  if (encoding == "sinusoidal") {
    const auto table = attn::sinusoidal_encoding<float>(n, kDim);
    for (int64_t i = 0; i < x.numel(); ++i) x[i] += table[i];
  } else if (encoding == "rope") {
    x = attn::apply_rope_per_head(x.view(), heads);
  } else if (encoding == "alibi") {
    options.alibi_slopes = attn::alibi_slopes(heads);
  } else if (encoding != "none") {
    throw attn::ValueError("encoding must be none, sinusoidal, rope or alibi, got '" + encoding + "'");
  }
  auto result = attn::multi_head_with_weights(x.view(), heads, options);
  s.out = std::move(result.out);
  s.weights = std::move(result.weights);
  return s;
}

template <class F>
std::string answer(F&& compute) {
  try {
    return compute().dump();
  } catch (const std::exception& e) {
    return json{{"error", e.what()}}.dump();
  }
}

// A tensor's values as a Float32Array (a copy) and its shape: arrays reach
// the page without text in between (as JSON, formatting took 20 ms of a
// 64-token compare at 8 heads: AMD EPYC Zen 4, Chromium 156).
emscripten::val floats(const attn::Tensor<float>& t) {
  emscripten::val out = emscripten::val::object();
  out.set("data", emscripten::val::global("Float32Array")
                      .new_(emscripten::typed_memory_view(static_cast<size_t>(t.numel()), t.data())));
  // (Numbers, not int64: embind passes those only as BigInt.)
  out.set("shape", emscripten::val::array(std::vector<double>(t.shape().begin(), t.shape().end())));
  return out;
}

// The two sentences of the order experiment side by side. Each token of A is
// matched to the same token of B (the first not yet matched); `max_difference`
// is the largest |out_A - out_B| over matched tokens' outputs, and
// `weight_difference` (heads, n_A, n_A) is A's weights less B's taken at the
// matched positions (0 where a token has no match). Tensors come as
// {data: Float32Array, shape}; an error as {error}.
emscripten::val compare(const std::string& a, const std::string& b, int heads, const std::string& encoding) {
  using emscripten::val;
  try {
    const Sentence sa = run_sentence(a, "sentence A", heads, encoding);
    const Sentence sb = run_sentence(b, "sentence B", heads, encoding);
    const auto na = static_cast<int64_t>(sa.tokens.size()), nb = static_cast<int64_t>(sb.tokens.size());
    std::vector<int64_t> match(na, -1);
    std::vector<bool> taken(nb, false);
    for (int64_t i = 0; i < na; ++i)
      for (int64_t j = 0; j < nb && match[i] < 0; ++j)
        if (!taken[j] && sa.tokens[i] == sb.tokens[j]) {
          match[i] = j;
          taken[j] = true;
        }
    double max_difference = 0;
    for (int64_t i = 0; i < na; ++i)
      if (match[i] >= 0)
        for (int64_t c = 0; c < kDim; ++c)
          max_difference = std::fmax(max_difference, std::fabs(double{sa.out[i * kDim + c]} -
                                                               double{sb.out[match[i] * kDim + c]}));
    attn::Tensor<float> difference({heads, na, na});
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < na; ++i)
        for (int64_t j = 0; j < na; ++j)
          if (match[i] >= 0 && match[j] >= 0)
            difference[(h * na + i) * na + j] =
                sa.weights[(h * na + i) * na + j] - sb.weights[(h * nb + match[i]) * nb + match[j]];
    const auto sentence = [](const Sentence& s) {
      val v = val::object();
      v.set("tokens", val::array(s.tokens.begin(), s.tokens.end()));
      v.set("out", floats(s.out));
      v.set("weights", floats(s.weights));
      return v;
    };
    val result = val::object();
    result.set("a", sentence(sa));
    result.set("b", sentence(sb));
    result.set("match", val::array(std::vector<double>(match.begin(), match.end())));
    result.set("max_difference", max_difference);
    result.set("weight_difference", floats(difference));
    result.set("dim", static_cast<double>(kDim));
    return result;
  } catch (const std::exception& e) {
    val error = val::object();
    error.set("error", std::string(e.what()));
    return error;
  }
}

// The encodings themselves: the sinusoidal table (n, d); RoPE's angle of
// each pair at `position` for `base` and a Hugging Face rope_scaling dict
// (JSON text, "" for none); ALiBi's slopes for `heads` heads and the biases
// −slope·(i − j) they add to query i's score of key j, over `tokens` tokens
// (heads, tokens, tokens), as attention() adds them without a causal mask.
std::string encodings(int n, int d, int position, double base, const std::string& scaling, int heads, int tokens) {
  return answer([&] {
    const auto table = attn::sinusoidal_encoding<float>(n, d, base);
    const attn::RopeScaling rope_scaling = scaling.empty() ? attn::RopeScaling{} : attn::parse_rope_scaling(scaling);
    const auto frequencies = attn::rope_frequencies(d, base, rope_scaling, position + 1);
    json angles = json::array();
    for (const double f : frequencies.inv_freq) angles.push_back(position * f);
    const auto slopes = attn::alibi_slopes(heads);
    attn::Tensor<float> biases({heads, tokens, tokens});
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < tokens; ++i)
        for (int j = 0; j < tokens; ++j) biases[(h * tokens + i) * tokens + j] = static_cast<float>(-slopes[h] * (i - j));
    return json{{"sinusoidal", nested(table)},
                {"rope", {{"inv_freq", frequencies.inv_freq}, {"angles", angles},
                          {"attention_factor", frequencies.attention_factor}}},
                {"alibi_slopes", slopes}, {"alibi_biases", nested(biases)}};
  });
}

// The pictures' colour maps, 256 steps each, as [r, g, b].
std::string colour_maps() {
  return answer([] {
    json viridis = json::array(), diverging = json::array();
    for (int i = 0; i < 256; ++i) {
      const attn::Rgb v = attn::viridis(i / 255.0), d = attn::blue_white_red(i / 255.0);
      viridis.push_back({v.r, v.g, v.b});
      diverging.push_back({d.r, d.g, d.b});
    }
    return json{{"viridis", viridis}, {"blue_white_red", diverging}};
  });
}

// The article's order experiment, without positions and with `encoding`:
// accuracies on held-out sentences, each in both orders. `progress` is
// called with (steps done, steps in all) as training goes.
std::string order_experiment(const std::string& encoding, int steps, emscripten::val progress) {
  return answer([&] {
    attn::OrderExperimentOptions options;
    options.steps = steps;
    const std::map<std::string, attn::Positional> kinds{
        {"sinusoidal", attn::Positional::Sinusoidal}, {"rope", attn::Positional::Rope},
        {"alibi", attn::Positional::Alibi}, {"learned", attn::Positional::Learned}};
    const auto kind = kinds.find(encoding);
    if (kind == kinds.end())
      throw attn::ValueError("the experiment's encoding must be sinusoidal, rope, alibi or learned, got '" + encoding + "'");
    options.variants = {attn::Positional::None, kind->second};
    options.on_progress = [&](int64_t done, int64_t total) { progress(static_cast<double>(done), static_cast<double>(total)); };
    const auto result = attn::run_order_experiment(options);
    return json{{"none", result.variants[0].accuracy}, {"positions", result.variants[1].accuracy},
                {"loss_none", result.variants[0].loss}, {"loss_positions", result.variants[1].loss},
                {"test_sentences", result.test_sentences}};
  });
}

// A page served without cross-origin isolation has no SharedArrayBuffer, so
// no threads: attn runs on the page's (or its worker's) one thread.
struct SingleThreaded {
  SingleThreaded() { attn::set_num_threads(1); }
} single_threaded;

}  // namespace

EMSCRIPTEN_BINDINGS(attn_web) {
  emscripten::function("compare", &compare);
  emscripten::function("encodings", &encodings);
  emscripten::function("colourMaps", &colour_maps);
  emscripten::function("orderExperiment", &order_experiment);
}
