#include "companion/adam.hpp"

#include <cmath>
#include <string>

namespace attn {

template <class T>
Adam<T>::Adam(std::vector<Tensor<T>*> parameters, const AdamOptions& options)
    : parameters_(std::move(parameters)), options_(options) {
  if (!(options.learning_rate > 0) || !(options.beta1 >= 0 && options.beta1 < 1) ||
      !(options.beta2 >= 0 && options.beta2 < 1) || !(options.eps > 0))
    throw ValueError("Adam: need learning_rate > 0, 0 <= beta1, beta2 < 1 and eps > 0, got " +
                     std::to_string(options.learning_rate) + ", " +
                     std::to_string(options.beta1) + ", " + std::to_string(options.beta2) +
                     ", " + std::to_string(options.eps));
  if (static_cast<T>(options.eps) == 0)
    throw ValueError("Adam: eps " + std::to_string(options.eps) + " rounds to 0 in the parameters' type");
  for (const Tensor<T>* p : parameters_) {
    m_.emplace_back(p->shape());
    v_.emplace_back(p->shape());
  }
}

template <class T>
void Adam<T>::step(const std::vector<Tensor<T>>& gradients) {
  if (gradients.size() != parameters_.size())
    throw ValueError("Adam: " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(parameters_.size()) + " parameters");
  ++t_;
  const auto& o = options_;
  const double c1 = 1 - std::pow(o.beta1, double(t_)), c2 = 1 - std::pow(o.beta2, double(t_));
  for (size_t k = 0; k < parameters_.size(); ++k) {
    Tensor<T>& p = *parameters_[k];
    const Tensor<T>& g = gradients[k];
    if (g.shape() != p.shape())
      throw ValueError("Adam: gradient " + std::to_string(k) + " has shape " +
                       shape_str(g.shape()) + ", its parameter " + shape_str(p.shape()));
    const T beta1 = T(o.beta1), beta2 = T(o.beta2), lr = T(o.learning_rate / c1), eps = T(o.eps);
    const T inv_c2 = T(1 / c2);
    for (int64_t i = 0; i < p.numel(); ++i) {
      m_[k][i] = beta1 * m_[k][i] + (1 - beta1) * g[i];
      v_[k][i] = beta2 * v_[k][i] + (1 - beta2) * g[i] * g[i];
      p[i] -= lr * m_[k][i] / (std::sqrt(v_[k][i] * inv_c2) + eps);
    }
  }
}

template class Adam<float>;
template class Adam<double>;

}  // namespace attn
