// Host reference RMSNorm and LayerNorm over the last dimension of x [rows, hidden].
//
// Row statistics accumulate in double. Weight gradients are accumulated (+=), activation
// gradients overwritten (autopar/device/ops.h). Instantiated for float and double; the double
// versions are what finite-difference tests differentiate.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019).
template <typename T>
void RmsNormForward(const T* x, const T* gamma, std::int64_t rows, std::int64_t hidden, T eps, T* y,
                    T* rstd);
template <typename T>
void RmsNormBackward(const T* dy, const T* x, const T* gamma, const T* rstd, std::int64_t rows,
                     std::int64_t hidden, T* dx, T* dgamma);

// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) (Ba et al. 2016).
template <typename T>
void LayerNormForward(const T* x, const T* gamma, const T* beta, std::int64_t rows,
                      std::int64_t hidden, T eps, T* y, T* mean, T* rstd);
template <typename T>
void LayerNormBackward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                       std::int64_t rows, std::int64_t hidden, T* dx, T* dgamma, T* dbeta);

}  // namespace autopar::kernels::ref
