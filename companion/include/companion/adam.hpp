// Adam (Kingma & Ba, 2015), with bias correction, as torch.optim.Adam
// without weight decay.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

struct AdamOptions {
  double learning_rate = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

template <class T>
class Adam {
 public:
  // The parameters are updated in place; they must outlive the optimizer.
  Adam(std::vector<Tensor<T>*> parameters, const AdamOptions& options = {});
  // One update from gradients in the order (and shapes) of the parameters.
  void step(const std::vector<Tensor<T>>& gradients);

 private:
  std::vector<Tensor<T>*> parameters_;
  std::vector<Tensor<T>> m_, v_;  // moment estimates, in T (as torch.optim.Adam)
  AdamOptions options_;
  int64_t t_ = 0;
};

extern template class Adam<float>;
extern template class Adam<double>;

}  // namespace attn
