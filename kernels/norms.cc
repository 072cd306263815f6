#include "kernels/norms.h"

#include <cmath>

namespace autopar::kernels::ref {
namespace {

// Offset of vector `vec` (= r * vectors + v) in an operand whose rows lie `stride` apart.
std::int64_t VectorOffset(std::int64_t vec, std::int64_t hidden, std::int64_t vectors,
                          std::int64_t stride) {
  if (stride == 0) stride = vectors * hidden;
  return vec / vectors * stride + vec % vectors * hidden;
}

}  // namespace

template <typename T>
void RmsNormForward(const T* x, const T* gamma, std::int64_t rows, std::int64_t hidden, T eps, T* y,
                    T* rstd, const NormLayout& layout) {
  const std::int64_t vectors = layout.vectors;
  for (std::int64_t r = 0; r < rows * vectors; ++r) {
    const T* xr = x + VectorOffset(r, hidden, vectors, layout.x_stride);
    T* yr = y + VectorOffset(r, hidden, vectors, layout.y_stride);
    double sum_sq = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) sum_sq += double{xr[i]} * double{xr[i]};
    const double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(hidden) + double{eps});
    rstd[r] = static_cast<T>(inv);
    for (std::int64_t i = 0; i < hidden; ++i) {
      yr[i] = static_cast<T>(double{xr[i]} * inv * double{gamma[i]});
    }
  }
}

template <typename T>
void RmsNormBackward(const T* dy, const T* x, const T* gamma, const T* rstd, std::int64_t rows,
                     std::int64_t hidden, T* dx, T* dgamma, const NormLayout& layout) {
  const std::int64_t vectors = layout.vectors;
  for (std::int64_t r = 0; r < rows * vectors; ++r) {
    const T* xr = x + VectorOffset(r, hidden, vectors, layout.x_stride);
    const T* dyr = dy + VectorOffset(r, hidden, vectors, layout.y_stride);
    T* dxr = dx + VectorOffset(r, hidden, vectors, layout.y_stride);
    const double inv = rstd[r];
    // dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * gamma, xhat = x * rstd.
    double dot = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) {
      dot += double{dyr[i]} * double{gamma[i]} * double{xr[i]} * inv;
    }
    const double mean_dot = dot / static_cast<double>(hidden);
    for (std::int64_t i = 0; i < hidden; ++i) {
      const double d = dyr[i];  // read before dx[i], which may be the same element, is written
      const double xhat = double{xr[i]} * inv;
      const double g = d * double{gamma[i]};
      dxr[i] = static_cast<T>(inv * (g - xhat * mean_dot));
      dgamma[i] = static_cast<T>(double{dgamma[i]} + d * xhat);
    }
  }
}

template <typename T>
void LayerNormForward(const T* x, const T* gamma, const T* beta, std::int64_t rows,
                      std::int64_t hidden, T eps, T* y, T* mean, T* rstd,
                      const NormLayout& layout) {
  const std::int64_t vectors = layout.vectors;
  for (std::int64_t r = 0; r < rows * vectors; ++r) {
    const T* xr = x + VectorOffset(r, hidden, vectors, layout.x_stride);
    T* yr = y + VectorOffset(r, hidden, vectors, layout.y_stride);
    double sum = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) sum += xr[i];
    const double mu = sum / static_cast<double>(hidden);
    double var = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) var += (double{xr[i]} - mu) * (double{xr[i]} - mu);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(hidden) + double{eps});
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(inv);
    for (std::int64_t i = 0; i < hidden; ++i) {
      yr[i] = static_cast<T>((double{xr[i]} - mu) * inv * double{gamma[i]} + double{beta[i]});
    }
  }
}

template <typename T>
void LayerNormBackward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                       std::int64_t rows, std::int64_t hidden, T* dx, T* dgamma, T* dbeta,
                       const NormLayout& layout) {
  const std::int64_t vectors = layout.vectors;
  for (std::int64_t r = 0; r < rows * vectors; ++r) {
    const T* xr = x + VectorOffset(r, hidden, vectors, layout.x_stride);
    const T* dyr = dy + VectorOffset(r, hidden, vectors, layout.y_stride);
    T* dxr = dx + VectorOffset(r, hidden, vectors, layout.y_stride);
    const double mu = mean[r];
    const double inv = rstd[r];
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
    double sum_g = 0.0;
    double sum_g_xhat = 0.0;
    for (std::int64_t i = 0; i < hidden; ++i) {
      const double g = double{dyr[i]} * double{gamma[i]};
      sum_g += g;
      sum_g_xhat += g * (double{xr[i]} - mu) * inv;
    }
    const double mean_g = sum_g / static_cast<double>(hidden);
    const double mean_g_xhat = sum_g_xhat / static_cast<double>(hidden);
    for (std::int64_t i = 0; i < hidden; ++i) {
      const double d = dyr[i];  // read before dx[i], which may be the same element, is written
      const double xhat = (double{xr[i]} - mu) * inv;
      const double g = d * double{gamma[i]};
      dxr[i] = static_cast<T>(inv * (g - mean_g - xhat * mean_g_xhat));
      dgamma[i] = static_cast<T>(double{dgamma[i]} + d * xhat);
      dbeta[i] = static_cast<T>(double{dbeta[i]} + d);
    }
  }
}

// T stands in type positions, where it cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define AUTOPAR_INSTANTIATE_NORMS(T)                                                             \
  template void RmsNormForward<T>(const T*, const T*, std::int64_t, std::int64_t, T, T*, T*,     \
                                  const NormLayout&);                                            \
  template void RmsNormBackward<T>(const T*, const T*, const T*, const T*, std::int64_t,         \
                                   std::int64_t, T*, T*, const NormLayout&);                     \
  template void LayerNormForward<T>(const T*, const T*, const T*, std::int64_t, std::int64_t, T, \
                                    T*, T*, T*, const NormLayout&);                              \
  template void LayerNormBackward<T>(const T*, const T*, const T*, const T*, const T*,           \
                                     std::int64_t, std::int64_t, T*, T*, T*, const NormLayout&);
AUTOPAR_INSTANTIATE_NORMS(float)
AUTOPAR_INSTANTIATE_NORMS(double)
#undef AUTOPAR_INSTANTIATE_NORMS
// NOLINTEND(bugprone-macro-parentheses)

}  // namespace autopar::kernels::ref
