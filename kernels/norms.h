// Host reference RMSNorm and LayerNorm over vectors of `hidden` elements.
//
// The vectors are rows × layout.vectors of them (NormLayout; by default one per row of a packed
// x [rows, hidden]); the statistics of vector v of row r are at index r * vectors + v. Row
// statistics accumulate in double. Weight gradients are accumulated (+=), activation gradients
// overwritten (autopar/device/ops.h, NormDesc). dx may alias dy: every element of dy is read
// before the same element of dx is written. Instantiated for float and double; the double versions
// are what finite-difference tests differentiate.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

// Where the vectors lie: element i of vector v of row r at r * stride + v * hidden + i, with
// x_stride for x and y_stride for y, dy and dx (0: packed, vectors * hidden). Megatron's
// qk-layernorm is vectors = heads, hidden = head_dim, y inside the fused QKV rows.
struct NormLayout {
  std::int64_t vectors = 1;
  std::int64_t x_stride = 0;
  std::int64_t y_stride = 0;
};

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019).
template <typename T>
void RmsNormForward(const T* x, const T* gamma, std::int64_t rows, std::int64_t hidden, T eps, T* y,
                    T* rstd, const NormLayout& layout = {});
template <typename T>
void RmsNormBackward(const T* dy, const T* x, const T* gamma, const T* rstd, std::int64_t rows,
                     std::int64_t hidden, T* dx, T* dgamma, const NormLayout& layout = {});

// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) (Ba et al. 2016).
template <typename T>
void LayerNormForward(const T* x, const T* gamma, const T* beta, std::int64_t rows,
                      std::int64_t hidden, T eps, T* y, T* mean, T* rstd,
                      const NormLayout& layout = {});
template <typename T>
void LayerNormBackward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                       std::int64_t rows, std::int64_t hidden, T* dx, T* dgamma, T* dbeta,
                       const NormLayout& layout = {});

}  // namespace autopar::kernels::ref
