#include "companion/embedding.hpp"

#include <string>

namespace attn {
namespace {

void check(TensorView<const int64_t> tokens, const Shape& table, const Shape* positions) {
  if (tokens.rank() != 2)
    throw ValueError("embed: tokens must be (batch, n), got shape " + shape_str(tokens.shape()));
  if (table.size() != 2)
    throw ValueError("embed: table must be (vocab, E), got shape " + shape_str(table));
  if (positions && (positions->size() != 2 || (*positions)[0] < tokens.dim(1) ||
                    (*positions)[1] != table[1]))
    throw ValueError("embed: positions must be (>= n, E) = (>= " + std::to_string(tokens.dim(1)) +
                     ", " + std::to_string(table[1]) + "), got shape " + shape_str(*positions));
  for (int64_t b = 0; b < tokens.dim(0); ++b)
    for (int64_t t = 0; t < tokens.dim(1); ++t) {
      const int64_t id = tokens.at({b, t});
      if (id < 0 || id >= table[0])
        throw ValueError("embed: token " + std::to_string(id) + " at (" + std::to_string(b) +
                         ", " + std::to_string(t) + ") is outside the vocabulary [0, " +
                         std::to_string(table[0]) + ")");
    }
}

}  // namespace

template <Real T>
Tensor<T> embed(TensorView<const int64_t> tokens, TensorView<const T> table,
                TensorView<const T> positions) {
  const bool pe = !positions.empty_view();
  check(tokens, table.shape(), pe ? &positions.shape() : nullptr);
  const int64_t B = tokens.dim(0), n = tokens.dim(1), E = table.dim(1);
  Tensor<T> x({B, n, E});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) {
      T* row = x.data() + (b * n + t) * E;
      const T* token = &table.at({tokens.at({b, t}), 0});
      const T* position = pe ? &positions.at({t, 0}) : nullptr;
      for (int64_t c = 0; c < E; ++c)
        row[c] = token[c * table.stride(1)] + (pe ? position[c * positions.stride(1)] : T(0));
    }
  return x;
}

template <Real T>
void embed_backward(TensorView<const int64_t> tokens, TensorView<const T> dx, TensorView<T> dtable,
                    TensorView<T> dpositions) {
  const bool pe = !dpositions.empty_view();
  check(tokens, dtable.shape(), pe ? &dpositions.shape() : nullptr);
  const int64_t B = tokens.dim(0), n = tokens.dim(1), E = dtable.dim(1);
  if (dx.shape() != Shape{B, n, E})
    throw ValueError("embed_backward: dx has shape " + shape_str(dx.shape()) + ", expected " +
                     shape_str({B, n, E}));
  // forward: x[b, t] = table[tokens[b, t]] + positions[t]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) {
      T* token = &dtable.at({tokens.at({b, t}), 0});
      T* position = pe ? &dpositions.at({t, 0}) : nullptr;
      const T* row = &dx.at({b, t, 0});
      for (int64_t c = 0; c < E; ++c) {
        token[c * dtable.stride(1)] += row[c * dx.stride(2)];
        if (pe) position[c * dpositions.stride(1)] += row[c * dx.stride(2)];
      }
    }
}

template Tensor<float> embed(TensorView<const int64_t>, TensorView<const float>, TensorView<const float>);
template Tensor<double> embed(TensorView<const int64_t>, TensorView<const double>, TensorView<const double>);
template void embed_backward(TensorView<const int64_t>, TensorView<const float>, TensorView<float>,
                             TensorView<float>);
template void embed_backward(TensorView<const int64_t>, TensorView<const double>, TensorView<double>,
                             TensorView<double>);

}  // namespace attn
