// Host reference activations: SwiGLU (Shazeer 2020) and GeLU with the tanh approximation
// (Hendrycks & Gimpel 2016), each computed in double per element.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

// x [rows, 2 * ffn] = [gate | up] (Megatron's chunk order); y [rows, ffn] = silu(gate) * up.
template <typename T>
void SwiGluForward(const T* x, std::int64_t rows, std::int64_t ffn, T* y);
// dx [rows, 2 * ffn]; dx may not alias x.
template <typename T>
void SwiGluBackward(const T* dy, const T* x, std::int64_t rows, std::int64_t ffn, T* dx);

// y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), elementwise over n; y may alias x.
template <typename T>
void GeluForward(const T* x, std::int64_t n, T* y);
// dx may alias dy.
template <typename T>
void GeluBackward(const T* dy, const T* x, std::int64_t n, T* dx);

}  // namespace autopar::kernels::ref
