#include "kernels/rope.h"

#include <cmath>
#include <vector>

namespace autopar::kernels::ref {
namespace {

// Rotates by +angle (forward) or -angle (backward: the transpose of a rotation is its inverse).
template <typename T>
void Rotate(const RopeShape& shape, const T* x, T* y, double sign) {
  const std::int64_t half = shape.rotary_dim / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    inv_freq[i] =
        std::pow(shape.base, -2.0 * static_cast<double>(i) / static_cast<double>(shape.rotary_dim));
  }
  for (std::int64_t s = 0; s < shape.seq; ++s) {
    const double position = static_cast<double>(shape.position_offset + s);
    for (std::int64_t b = 0; b < shape.batch; ++b) {
      const std::int64_t row = (s * shape.batch + b) * shape.row_stride;
      for (std::int64_t h = 0; h < shape.heads; ++h) {
        const T* xh = x + row + h * shape.head_dim;
        T* yh = y + row + h * shape.head_dim;
        for (std::int64_t i = 0; i < half; ++i) {
          const double angle = position * inv_freq[i];
          const double c = std::cos(angle);
          const double sn = sign * std::sin(angle);
          const double x1 = xh[i];
          const double x2 = xh[i + half];
          yh[i] = static_cast<T>(x1 * c - x2 * sn);
          yh[i + half] = static_cast<T>(x2 * c + x1 * sn);
        }
        if (yh != xh) {
          for (std::int64_t i = shape.rotary_dim; i < shape.head_dim; ++i) yh[i] = xh[i];
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void RopeForward(const RopeShape& shape, const T* x, T* y) {
  Rotate(shape, x, y, 1.0);
}

template <typename T>
void RopeBackward(const RopeShape& shape, const T* dy, T* dx) {
  Rotate(shape, dy, dx, -1.0);
}

template void RopeForward<float>(const RopeShape&, const float*, float*);
template void RopeForward<double>(const RopeShape&, const double*, double*);
template void RopeBackward<float>(const RopeShape&, const float*, float*);
template void RopeBackward<double>(const RopeShape&, const double*, double*);

}  // namespace autopar::kernels::ref
