// `attn attend`: the article's multi_head on the user's own array, optionally
// with positions encoded and a causal mask; the weights drawn head by head.
#include <variant>

#include "attn/attn.hpp"
#include "attn/io.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"
#include "cli/heat_maps.hpp"

namespace attn::cli {
namespace {

template <class T>
void attend(const AttendArgs& args, Tensor<T> x) {
  if (x.rank() != 2 && x.rank() != 3)
    throw ValueError("attend: " + args.input + " has shape " + shape_str(x.shape()) +
                     "; expected (n, d) or (batch, n, d)");
  const auto tokens = split_tokens(args.tokens);
  if (!tokens.empty() && static_cast<int64_t>(tokens.size()) != x.dim(-2))
    throw ValueError("attend: --tokens gives " + std::to_string(tokens.size()) +
                     " tokens, but " + args.input + " of shape " + shape_str(x.shape()) +
                     " has n = " + std::to_string(x.dim(-2)) + " rows");
  x = with_positions(std::move(x), args.pe, args.heads);
  const AttentionOptions& options = args.attention;
  Outputs outputs;
  if (args.weights.empty()) {
    outputs.add(args.out, encode_npy(multi_head(x.view(), args.heads, options).view()));
    return outputs.write();
  }
  const auto result = multi_head_with_weights(x.view(), args.heads, options);
  // The titles say what was drawn: the sentence, the encoding, the mask.
  std::string caption = join_tokens(tokens);
  caption += (caption.empty() ? "" : ", ") + encoding_title(args.pe);
  if (options.causal != Causal::None) caption += ", causal";
  outputs.add(args.out, encode_npy(result.out.view()));
  outputs.add(args.weights, weights_picture(output_format(args.weights, {".png", ".svg"}), result.weights, tokens,
                                            caption, probability_scale()));
  outputs.write();
}

}  // namespace

int run_attend(const AttendArgs& args) {
  std::visit([&](auto&& x) { attend(args, std::move(x)); }, read_npy(args.input));
  return 0;
}

}  // namespace attn::cli
