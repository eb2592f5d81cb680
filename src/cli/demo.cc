// `attn demo`: the article, step by step, with numbers.
#include "cli/commands.hpp"
#include "cli/files.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/file.hpp"
#include "attn/io.hpp"
#include "cli/heat_maps.hpp"

namespace attn::cli {
namespace {

constexpr int64_t kDim = 8;
constexpr int64_t kHeads = 4;
constexpr int64_t kTableRows = 50, kTableDim = 64;  // the pictured table: enough to show its stripes

// Fixed word vectors (8 dims): any distinct values would do.
const char* const kWords[] = {"猫", "咬", "狗"};
const float kVectors[3][kDim] = {
    {0.9f, 0.1f, 0.4f, 0.7f, 0.2f, 0.8f, 0.3f, 0.5f},  // 猫 cat
    {0.2f, 0.9f, 0.6f, 0.1f, 0.7f, 0.3f, 0.8f, 0.4f},  // 咬 bite
    {0.6f, 0.3f, 0.9f, 0.5f, 0.1f, 0.6f, 0.2f, 0.9f},  // 狗 dog
};

Tensor<float> sentence(const std::vector<int>& words) {
  Tensor<float> x({static_cast<int64_t>(words.size()), kDim});
  for (size_t t = 0; t < words.size(); ++t)
    for (int64_t c = 0; c < kDim; ++c) x[t * kDim + c] = kVectors[words[t]][c];
  return x;
}

// Largest |a[row_a] - b[row_b]| over the columns.
float row_diff(const Tensor<float>& a, int64_t row_a, const Tensor<float>& b, int64_t row_b) {
  float m = 0;
  for (int64_t c = 0; c < a.dim(1); ++c)
    m = std::fmax(m, std::fabs(a[row_a * a.dim(1) + c] - b[row_b * b.dim(1) + c]));
  return m;
}

const std::vector<int> kCatBitesDog{0, 1, 2}, kDogBitesCat{2, 1, 0};

// The outputs of 猫 咬 狗 and 狗 咬 猫 with positions encoded, compared word by word.
void compare_sentences(const char* title, PositionalEncoding encoding) {
  const auto y1 = multi_head(with_positions(sentence(kCatBitesDog), encoding, kHeads).view(), kHeads);
  const auto y2 = multi_head(with_positions(sentence(kDogBitesCat), encoding, kHeads).view(), kHeads);
  std::printf("%s\n", title);
  for (int w = 0; w < 3; ++w) {
    const int64_t in1 = w, in2 = 2 - w;  // positions of word w in s1 and s2
    std::printf("     %s: position %lld vs %lld, max |difference| = %.3g\n", kWords[w],
                static_cast<long long>(in1), static_cast<long long>(in2),
                row_diff(y1, in1, y2, in2));
  }
}

// 狗 咬 猫 is 猫 咬 狗 mirrored: reversing the rows and columns of its weights
// (heads, n, n) lines its words up with 猫 咬 狗's.
Tensor<double> weight_difference(const Tensor<float>& cat_bites_dog,
                                 const Tensor<float>& dog_bites_cat) {
  const int64_t heads = cat_bites_dog.dim(0), n = cat_bites_dog.dim(1);
  Tensor<double> d({heads, n, n});
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        d[(h * n + i) * n + j] = double{cat_bites_dog[(h * n + i) * n + j]} -
                                 double{dog_bites_cat[(h * n + (n - 1 - i)) * n + (n - 1 - j)]};
  return d;
}

// (Comparisons, not std::fmax, here and in write_weights: g++ 12's aarch64
// vectorizer crashes on fmin/fmax reductions.)
double max_abs(const Tensor<double>& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::fabs(t[i]) > m) m = std::fabs(t[i]);
  return m;
}

// One sentence of the walkthrough: its words and each encoding's weights.
struct Sentence {
  const char* name;
  std::vector<int> words;
  std::string text;
  std::vector<std::string> tokens;
  std::map<PositionalEncoding, Tensor<float>> weights;  // (heads, n, n)
};

// The walkthrough's files in a folder, each picture as .png and .svg,
// written together at the end (Outputs).
class PictureFolder {
 public:
  explicit PictureFolder(std::string folder) : folder_(std::move(folder)) {
    make_folder(folder_, "demo");
  }
  std::string path(const std::string& file) const {
    return (std::filesystem::path(folder_) / file).string();
  }
  void add(const std::string& file, std::string bytes) { outputs_.add(path(file), std::move(bytes)); }
  template <class Encode>
  void both(const std::string& name, Encode encode) {
    for (const char* format : {".png", ".svg"}) add(name + format, encode(format));
    std::printf("   %s.png, .svg\n", path(name).c_str());
  }
  void write() { outputs_.write(); }

 private:
  std::string folder_;
  Outputs outputs_;
};

// Each head's weights, both sentences with each encoding, on one scale.
void write_weights(PictureFolder& out, const std::vector<Sentence>& sentences) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Sentence& s : sentences)
    for (const auto& [encoding, weights] : s.weights)
      for (int64_t i = 0; i < weights.numel(); ++i) {
        if (weights[i] < lo) lo = weights[i];
        if (weights[i] > hi) hi = weights[i];
      }
  // The weights lie in a narrow band: drawn on it (the same for all six
  // pictures) their differences show; on [0, 1] they would look alike.
  PictureOptions scale;
  scale.vmin = lo;
  scale.vmax = hi;
  scale.scale_title = "weight, the demo's range";
  std::printf("   the weights of each head (row: the word attending, the query; column: the word\n"
              "   attended to, the key), all on one scale, the demo's range, %.2f to %.2f:\n", lo, hi);
  for (const Sentence& s : sentences)
    for (const auto& [encoding_name, encoding] : kPositionalEncodings) {
      const std::string caption = s.text + ", " + encoding_title(encoding);
      out.both(std::string("weights_") + s.name + "_" + encoding_name, [&](const std::string& format) {
        return weights_picture(format, s.weights.at(encoding), s.tokens, caption, scale);
      });
    }
}

// The first sentence's weights minus the second's un-mirrored, per encoding,
// on one scale symmetric about 0.
void write_differences(PictureFolder& out, const std::vector<Sentence>& sentences) {
  std::printf("   %s's weights minus %s's with rows and columns reversed (so that the words\n"
              "   line up), on one scale symmetric about 0 (white):\n",
              sentences[0].text.c_str(), sentences[1].text.c_str());
  std::map<PositionalEncoding, Tensor<double>> differences;
  double largest = 0;
  for (const auto& [encoding_name, encoding] : kPositionalEncodings) {
    auto d = weight_difference(sentences[0].weights.at(encoding), sentences[1].weights.at(encoding));
    largest = std::fmax(largest, max_abs(d));
    differences.emplace(encoding, std::move(d));
  }
  PictureOptions scale;
  scale.colour_map = ColourMap::BlueWhiteRed;
  scale.vmin = -largest;
  scale.vmax = largest;
  scale.scale_title = "difference (" + sentences[1].text + " reversed)";
  for (const auto& [encoding_name, encoding] : kPositionalEncodings) {
    const auto& d = differences.at(encoding);
    const std::string caption =
        sentences[0].text + " - " + sentences[1].text + ", " + encoding_title(encoding);
    out.both(std::string("difference_") + encoding_name, [&](const std::string& format) {
      return weights_picture(format, d, sentences[0].tokens, caption, scale);
    });
    std::printf("     %s: max |difference| = %.3g\n", encoding_title(encoding).c_str(), max_abs(d));
  }
  std::printf("   -> without positions the difference is blank: 狗 咬 猫's weights are 猫 咬 狗's\n"
              "      reversed. With positions it is not.\n");
}

// The walkthrough's pictures, each as .png and .svg, into `folder`, and the
// two sentences' word vectors as .npy (the input of `attn attend`).
void write_pictures(const std::string& folder) {
  PictureFolder out(folder);
  std::printf("5. Pictures (the .svg files show each value on hover):\n");
  std::printf("   the sinusoidal table, n=%lld, d=%lld (fast stripes left, slow right):\n",
              static_cast<long long>(kTableRows), static_cast<long long>(kTableDim));
  const auto table = sinusoidal_encoding<float>(kTableRows, kTableDim);
  out.both("positional_encoding", [&](const std::string& format) { return encoding_picture(format, table); });

  std::vector<Sentence> sentences{{"cat_bites_dog", kCatBitesDog, "", {}, {}},
                                  {"dog_bites_cat", kDogBitesCat, "", {}, {}}};
  for (Sentence& s : sentences) {
    for (int w : s.words) s.tokens.emplace_back(kWords[w]);
    s.text = join_tokens(s.tokens);
    const auto x = sentence(s.words);
    out.add(std::string(s.name) + ".npy", encode_npy(x.view()));
    for (const auto& [encoding_name, encoding] : kPositionalEncodings)
      s.weights.emplace(encoding, multi_head_with_weights(with_positions(x, encoding, kHeads).view(),
                                                          kHeads).weights);
  }
  write_weights(out, sentences);
  write_differences(out, sentences);
  out.write();
}

}  // namespace

int run_demo(const DemoArgs& args) {
  std::printf("attn demo — the article, step by step\n\n");

  std::printf("1. Multi-head attention = attention on slices of the model dimension.\n");
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  Tensor<float> x({5, kDim});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = uniform(rng);
  const auto y = multi_head(x.view(), kHeads);
  std::printf("   x = random (5, 8); multi_head(x, heads=4).shape = %s\n\n",
              shape_str(y.shape()).c_str());

  std::printf("2. Attention is blind to word order: 猫 咬 狗 (cat bites dog) vs 狗 咬 猫.\n");
  compare_sentences("   without positional encoding (each word's output is the same):",
                    PositionalEncoding::None);
  std::printf("   -> only float rounding (~1e-7): the two sentences are indistinguishable.\n\n");

  std::printf("3. Positional encoding fixes it.\n");
  compare_sentences("   sinusoidal encoding added (x + pe):", PositionalEncoding::Sinusoidal);
  compare_sentences("   RoPE applied (each head's vectors rotated by position):",
                    PositionalEncoding::Rope);
  std::printf("   -> the same word now comes out differently in the two sentences.\n\n");

  std::printf("4. The sinusoidal table, first rows (n=5, d=8): pe[p, i] = sin/cos(p / 10000^(2*(i//2)/d))\n");
  const auto pe = sinusoidal_encoding<float>(5, kDim);
  for (int64_t p = 0; p < 5; ++p) {
    std::printf("   p=%lld:", static_cast<long long>(p));
    for (int64_t i = 0; i < kDim; ++i) std::printf(" %+.4f", pe[p * kDim + i]);
    std::printf("\n");
  }
  if (!args.out.empty()) {
    std::printf("\n");
    write_pictures(args.out);
  }
  std::printf("\nNext (the article's next post): Q, K, V come from learnable weights Wq, Wk, Wv.\n");
  return 0;
}

}  // namespace attn::cli
