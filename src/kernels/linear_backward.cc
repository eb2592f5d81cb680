// The backward of y = x Wᵀ + b in plain loops (the layer's sizes in training
// are small; the compiler vectorizes the inner loops).
#include "kernels/linear.hpp"

#include <algorithm>

namespace attn::detail {

template <class T>
void linear_backward(const T* x, const T* w, const T* dy, int64_t rows, int64_t in, int64_t out,
                     T* dx, T* dw, T* db) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * in;
    const T* dyr = dy + r * out;
    T* dxr = dx ? dx + r * in : nullptr;
    if (dxr) std::fill(dxr, dxr + in, T(0));
    // forward: y[r][o] = sum_c x[r][c] w[o][c] + b[o]
    for (int64_t o = 0; o < out; ++o) {
      const T g = dyr[o];
      const T* wo = w + o * in;
      T* dwo = dw + o * in;
      if (dxr)
        for (int64_t c = 0; c < in; ++c) dxr[c] += g * wo[c];
      for (int64_t c = 0; c < in; ++c) dwo[c] += g * xr[c];
      if (db) db[o] += g;
    }
  }
}

template void linear_backward<float>(const float*, const float*, const float*, int64_t, int64_t,
                                     int64_t, float*, float*, float*);
template void linear_backward<double>(const double*, const double*, const double*, int64_t,
                                      int64_t, int64_t, double*, double*, double*);

}  // namespace attn::detail
