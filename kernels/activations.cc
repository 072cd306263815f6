#include "kernels/activations.h"

#include <cmath>

namespace autopar::kernels::ref {
namespace {

double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

}  // namespace

template <typename T>
void SwiGluForward(const T* x, std::int64_t rows, std::int64_t ffn, T* y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * ffn;
    const T* up = gate + ffn;
    for (std::int64_t i = 0; i < ffn; ++i) {
      const double g = gate[i];
      y[r * ffn + i] = static_cast<T>(g * Sigmoid(g) * double{up[i]});
    }
  }
}

template <typename T>
void SwiGluBackward(const T* dy, const T* x, std::int64_t rows, std::int64_t ffn, T* dx) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * 2 * ffn;
    const T* up = gate + ffn;
    T* dgate = dx + r * 2 * ffn;
    T* dup = dgate + ffn;
    for (std::int64_t i = 0; i < ffn; ++i) {
      const double g = gate[i];
      const double sig = Sigmoid(g);
      const double d = dy[r * ffn + i];
      // d silu(g) / dg = sig * (1 + g * (1 - sig)).
      dgate[i] = static_cast<T>(d * double{up[i]} * sig * (1.0 + g * (1.0 - sig)));
      dup[i] = static_cast<T>(d * g * sig);
    }
  }
}

template <typename T>
void GeluForward(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<T>(0.5 * v * (1.0 + std::tanh(kGeluK * (v + kGeluC * v * v * v))));
  }
}

template <typename T>
void GeluBackward(const T* dy, const T* x, std::int64_t n, T* dx) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double t = std::tanh(kGeluK * (v + kGeluC * v * v * v));
    const double grad =
        0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * kGeluC * v * v);
    dx[i] = static_cast<T>(double{dy[i]} * grad);
  }
}

#define AUTOPAR_INSTANTIATE_ACTIVATIONS(T)                                             \
  template void SwiGluForward<T>(const T*, std::int64_t, std::int64_t, T*);            \
  template void SwiGluBackward<T>(const T*, const T*, std::int64_t, std::int64_t, T*); \
  template void GeluForward<T>(const T*, std::int64_t, T*);                            \
  template void GeluBackward<T>(const T*, const T*, std::int64_t, T*);
AUTOPAR_INSTANTIATE_ACTIVATIONS(float)
AUTOPAR_INSTANTIATE_ACTIVATIONS(double)
#undef AUTOPAR_INSTANTIATE_ACTIVATIONS

}  // namespace autopar::kernels::ref
