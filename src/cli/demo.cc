// `attn demo`: the article, step by step, with numbers.
#include "cli/commands.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
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

// The walkthrough's pictures, each as .png and .svg, into `folder`.
void write_pictures(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(folder, error);
  if (error)
    throw IOError("demo: cannot create the folder '" + folder + "': " + error.message());
  auto both = [&](const std::string& name, auto draw) {
    for (const char* ext : {".png", ".svg"}) draw((fs::path(folder) / (name + ext)).string());
    std::printf("   %s.png, .svg\n", (fs::path(folder) / name).string().c_str());
  };
  std::printf("5. Pictures (the .svg files name the words and show each weight on hover):\n");
  std::printf("   the sinusoidal table, n=%lld, d=%lld (fast stripes left, slow right):\n",
              static_cast<long long>(kTableRows), static_cast<long long>(kTableDim));
  const auto table = sinusoidal_encoding<float>(kTableRows, kTableDim);
  both("positional_encoding",
       [&](const std::string& path) { write_file(path, {encoding_picture(path, table)}); });
  std::printf("   the weights of each head (row: the word attending; column: the word attended to):\n");
  for (const auto& [name, words] : {std::pair{"cat_bites_dog", kCatBitesDog},
                                    std::pair{"dog_bites_cat", kDogBitesCat}}) {
    std::vector<std::string> tokens;
    for (int w : words) tokens.emplace_back(kWords[w]);
    for (const auto& [encoding_name, encoding] : kPositionalEncodings) {
      const auto x = with_positions(sentence(words), encoding, kHeads);
      const auto weights = multi_head_with_weights(x.view(), kHeads).weights;
      both(std::string("weights_") + name + "_" + encoding_name,
           [&](const std::string& path) { write_file(path, {weights_picture(path, weights, tokens)}); });
    }
  }
  std::printf("   -> without positions, 狗 咬 猫's weights are 猫 咬 狗's with rows and columns\n"
              "      reversed; with positions they are not.\n");
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
