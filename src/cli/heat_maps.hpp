// The heat maps the CLI draws: the positional encodings (the sinusoidal
// table, RoPE's angles, ALiBi's biases), and attention weights head by head.
// Each gives the bytes of the picture in `format` (".png" or ".svg") without
// writing it: a command writes all its outputs together (Outputs).
#pragma once

#include <string>
#include <vector>

#include "companion/picture.hpp"
#include "attn/rope_scaling.hpp"

namespace attn::cli {

// The table (n, d) as one map, on the scale [-1, 1] of sin and cos.
std::string encoding_picture(const std::string& format, const Tensor<float>& table);

// RoPE's angles (n, d/2), drawn as one row per frequency pair along the
// positions, mod 2π (so that each stripe along a row is one full turn):
// `plain` for base alone and, when `scaled` is not empty, under it the angles
// with `scaling`, whose attention factor the title gives.
std::string rope_picture(const std::string& format, const Tensor<double>& plain, double base,
                         const RopeScaling& scaling, double attention_factor,
                         const Tensor<double>& scaled);

// ALiBi's bias (heads, n) by head and distance, each head labelled with its slope.
std::string alibi_picture(const std::string& format, const Tensor<double>& bias,
                          const std::vector<double>& slopes);

// The scale of probabilities, [0, 1], comparable from one picture to the next.
PictureOptions probability_scale();

// weights (heads, n, n) or (batch, heads, n, n), drawn one map per head, a row
// of the grid per batch element, on the scale `options` gives; the maps are
// titled "<caption>, head h" ("<caption>, batch b, head h"; no caption: "head h").
// tokens: none, or one per word (labels on both axes).
template <class T>
std::string weights_picture(const std::string& format, const Tensor<T>& weights,
                            const std::vector<std::string>& tokens, const std::string& caption,
                            PictureOptions options);

// "猫 咬 狗" -> {"猫", "咬", "狗"} (split at spaces), and back.
std::vector<std::string> split_tokens(const std::string& text);
std::string join_tokens(const std::vector<std::string>& tokens);

}  // namespace attn::cli
