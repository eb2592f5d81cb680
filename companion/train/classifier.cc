// The classifier: forward and backward, llm.c style (the backward walks the
// forward's steps in reverse, each commented with the line it undoes).
#include <algorithm>
#include <cmath>
#include <utility>

#include "attn/linear.hpp"
#include "attn/positional.hpp"
#include "attn/random.hpp"
#include "companion/embedding.hpp"
#include "companion/train.hpp"

namespace attn {

Positional parse_positional(const std::string& name) {
  if (name == "none") return Positional::None;
  if (name == "sinusoidal") return Positional::Sinusoidal;
  if (name == "learned") return Positional::Learned;
  if (name == "rope") return Positional::Rope;
  if (name == "alibi") return Positional::Alibi;
  throw ValueError("positional encoding must be none, sinusoidal, learned, rope or alibi, got '" +
                   name + "'");
}

Dtype parse_dtype(const std::string& name) {
  if (name == "f32") return Dtype::Float32;
  if (name == "f64") return Dtype::Float64;
  throw ValueError("dtype must be f32 or f64, got '" + name + "'");
}

std::string dtype_name(Dtype d) { return d == Dtype::Float32 ? "f32" : "f64"; }

std::string positional_name(Positional p) {
  switch (p) {
    case Positional::None: return "none";
    case Positional::Sinusoidal: return "sinusoidal";
    case Positional::Learned: return "learned";
    case Positional::Rope: return "rope";
    case Positional::Alibi: return "alibi";
  }
  return "?";
}

namespace {

// The first token the read-out takes: all of them for the mean, else the last.
int64_t first_pooled(const ClassifierConfig& c, int64_t n) { return c.readout == Readout::Mean ? 0 : n - 1; }

}  // namespace

template <class T>
Classifier<T>::Classifier(const ClassifierConfig& c, uint64_t seed) : config_(c) {
  const auto bad = [](const std::string& m) { throw ValueError("Classifier: " + m); };
  if (c.vocab_size < 1 || c.max_len < 1 || c.num_classes < 1)
    bad("vocab_size, max_len and num_classes must be >= 1, got " + std::to_string(c.vocab_size) +
        ", " + std::to_string(c.max_len) + ", " + std::to_string(c.num_classes));
  if (c.num_layers < 1) bad("num_layers must be >= 1, got " + std::to_string(c.num_layers));
  std::mt19937_64 rng(seed);
  tokens_ = uniform<T>({c.vocab_size, c.embed_dim}, 1.0, rng);
  if (c.positional == Positional::Sinusoidal)
    positions_ = sinusoidal_encoding<T>(c.max_len, c.embed_dim);
  if (c.positional == Positional::Learned)
    positions_ = uniform<T>({c.max_len, c.embed_dim}, 1.0, rng);
  MultiHeadAttentionConfig mc;
  mc.embed_dim = c.embed_dim;
  mc.num_heads = c.num_heads;
  mc.rope = c.positional == Positional::Rope;
  mc.alibi = c.positional == Positional::Alibi;
  for (int64_t l = 0; l < c.num_layers; ++l) layers_.emplace_back(mc, rng());
  readout_w_ = uniform<T>({c.num_classes, c.embed_dim}, 1 / std::sqrt(double(c.embed_dim)), rng);
  readout_b_ = Tensor<T>({c.num_classes});
}

template <class T>
std::vector<const Tensor<T>*> Classifier<T>::parameters() const {
  std::vector<const Tensor<T>*> p{&tokens_};
  if (config_.positional == Positional::Learned) p.push_back(&positions_);
  for (const auto& layer : layers_)
    for (const Tensor<T>* t : layer.parameters()) p.push_back(t);
  p.push_back(&readout_w_);
  p.push_back(&readout_b_);
  return p;
}

template <class T>
std::vector<Tensor<T>*> Classifier<T>::parameters() {
  std::vector<Tensor<T>*> p;
  for (const Tensor<T>* t : std::as_const(*this).parameters()) p.push_back(const_cast<Tensor<T>*>(t));
  return p;
}

template <class T>
int64_t Classifier<T>::parameter_count() const {
  int64_t n = 0;
  for (const Tensor<T>* t : parameters()) n += t->numel();
  return n;
}

template <class T>
struct Classifier<T>::Forward {
  std::vector<Tensor<T>> x;        // x[0] the embedded input, x[l + 1] after layer l
  std::vector<Tensor<T>> weights;  // per layer, when asked for
  std::vector<std::shared_ptr<const MhaSaved<T>>> saved;  // per layer, for the backward
  Tensor<T> pooled;                // (batch, E)
  Tensor<T> logits;                // (batch, classes)
};

template <class T>
typename Classifier<T>::Forward Classifier<T>::forward(TensorView<const int64_t> tokens, bool need_weights,
                                                        bool save_for_backward) const {
  const auto& c = config_;
  if (tokens.rank() != 2 || tokens.dim(1) < 1 || tokens.dim(1) > c.max_len)
    throw ValueError("Classifier: tokens must be (batch, n) with 1 <= n <= max_len = " +
                     std::to_string(c.max_len) + ", got shape " + shape_str(tokens.shape()));
  const int64_t B = tokens.dim(0), n = tokens.dim(1), E = c.embed_dim;
  Forward f;
  // x = token embedding + absolute position (sinusoidal or learned)
  f.x.push_back(embed<T>(tokens, tokens_.view(), positions_.rank() ? positions_.view() : TensorView<const T>()));
  // x = x + attention(x), per layer
  MhaForwardOptions<T> opt;
  opt.need_weights = need_weights;
  opt.average_attn_weights = false;
  opt.save_for_backward = save_for_backward;
  for (const auto& layer : layers_) {
    auto y = layer.forward(f.x.back().view(), {}, {}, opt);
    if (save_for_backward) f.saved.push_back(std::move(y.saved));
    for (int64_t i = 0; i < y.out.numel(); ++i) y.out[i] += f.x.back()[i];
    f.x.push_back(std::move(y.out));
    if (need_weights) f.weights.push_back(std::move(*y.weights));
  }
  // pooled = mean over tokens, or the last token
  const Tensor<T>& h = f.x.back();
  f.pooled = Tensor<T>({B, E});
  const int64_t first = first_pooled(c, n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = first; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) f.pooled[b * E + e] += h[(b * n + t) * E + e] / T(n - first);
  // logits = pooled W_rᵀ + b_r
  f.logits = Tensor<T>({B, c.num_classes});
  linear<T>(f.pooled.view(), readout_w_.view(), readout_b_.view(), f.logits.view());
  return f;
}

template <class T>
Tensor<T> Classifier<T>::logits(TensorView<const int64_t> tokens) const {
  return forward(tokens, false, false).logits;
}

template <class T>
std::vector<Tensor<T>> Classifier<T>::attention_weights(TensorView<const int64_t> tokens) const {
  return forward(tokens, true, false).weights;
}

template <class T>
double Classifier<T>::accuracy(const Batch& batch) const {
  const Tensor<T> z = logits(batch.tokens.view());
  const int64_t K = z.dim(1);
  int64_t right = 0;
  for (int64_t b = 0; b < z.dim(0); ++b)
    right += std::max_element(z.data() + b * K, z.data() + (b + 1) * K) - (z.data() + b * K) ==
             batch.labels[b];
  return z.dim(0) ? double(right) / double(z.dim(0)) : 0.0;
}

template <class T>
double Classifier<T>::loss(const Batch& batch, std::vector<Tensor<T>>* gradients) const {
  const auto& c = config_;
  const int64_t B = batch.tokens.dim(0), n = batch.tokens.dim(1), E = c.embed_dim, K = c.num_classes;
  if (static_cast<int64_t>(batch.labels.size()) != B)
    throw ValueError("Classifier: " + std::to_string(batch.labels.size()) + " labels for " +
                     std::to_string(B) + " sequences");
  const Forward f = forward(batch.tokens.view(), false, gradients != nullptr);
  // loss = mean_b (logsumexp(logits[b]) - logits[b][label])
  Tensor<T> dlogits({B, K});
  double loss = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t y = batch.labels[b];
    if (y < 0 || y >= K)
      throw ValueError("Classifier: label " + std::to_string(y) + " outside [0, " +
                       std::to_string(K) + ")");
    const T* z = f.logits.data() + b * K;
    const T max = *std::max_element(z, z + K);
    T sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += std::exp(z[k] - max);
    loss += double(max + std::log(sum) - z[y]) / double(B);
    // the backward of the line above: d/dz = (softmax(z) - onehot(y)) / B
    for (int64_t k = 0; k < K; ++k)
      dlogits[b * K + k] = (std::exp(z[k] - max) / sum - T(k == y ? 1 : 0)) / T(B);
  }
  if (!gradients) return loss;

  std::vector<Tensor<T>>& g = *gradients;
  g.clear();
  for (const Tensor<T>* p : parameters()) g.emplace_back(p->shape());
  size_t at = 0;
  Tensor<T>& dtokens = g[at++];
  Tensor<T>* dpositions = c.positional == Positional::Learned ? &g[at++] : nullptr;
  const size_t first_layer = at;
  Tensor<T>&dreadout_w = g[g.size() - 2], &dreadout_b = g[g.size() - 1];

  // logits = pooled W_rᵀ + b_r
  Tensor<T> dpooled({B, E});
  linear_backward<T>(f.pooled.view(), readout_w_.view(), dlogits.view(), dpooled.view(), dreadout_w.view(),
                     dreadout_b.view());
  // pooled = mean over tokens, or the last token
  Tensor<T> dx({B, n, E});
  const int64_t first = first_pooled(c, n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = first; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) dx[(b * n + t) * E + e] = dpooled[b * E + e] / T(n - first);
  // x = x + attention(x), per layer, last first
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    auto lg = layers_[l].backward(dx.view(), *f.saved[l]);
    for (int64_t i = 0; i < dx.numel(); ++i) dx[i] += lg.query[i];
    size_t p = first_layer;
    for (int64_t k = 0; k < l; ++k) p += layers_[k].parameters().size();
    for (auto& t : lg.parameters) g[p++] = std::move(t);
  }
  // x = token embedding + absolute position
  embed_backward<T>(batch.tokens.view(), dx.view(), dtokens.view(),
                 dpositions ? dpositions->view() : TensorView<T>());
  return loss;
}

template class Classifier<float>;
template class Classifier<double>;

}  // namespace attn
