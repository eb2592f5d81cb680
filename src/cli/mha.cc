// `attn mha`: run a saved MultiHeadAttention layer on a .npy array.
#include <variant>

#include "attn/attn.hpp"
#include "attn/io.hpp"
#include "cli/commands.hpp"
#include "cli/files.hpp"

namespace attn::cli {
namespace {

template <class T>
void run(const MhaArgs& args, const Tensor<T>& x) {
  const auto layer = MultiHeadAttention<T>::load(args.weights);
  MhaForwardOptions<T> opt;
  opt.attention = args.attention;
  const auto y = layer.forward(x.view(), {}, {}, opt);
  Outputs outputs;
  outputs.add(args.out, encode_npy(y.out.view()));
  outputs.write();
}

}  // namespace

int run_mha(const MhaArgs& args) {
  std::visit([&](const auto& x) { run(args, x); }, read_npy(args.input));
  return 0;
}

}  // namespace attn::cli
