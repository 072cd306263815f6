// SwiGLU and tanh-GeLU, forward and backward (ref: kernels/activations.h), elementwise in float.
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float Sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// x [rows, 2 * ffn] = [gate | up]; y [rows, ffn].
template <typename T>
__global__ void SwiGluForwardKernel(const T* x, std::int64_t rows, std::int64_t ffn, T* y) {
  const std::int64_t n = rows * ffn;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t r = i / ffn;
    const std::int64_t c = i % ffn;
    const float g = ToFloat(x[r * 2 * ffn + c]);
    const float u = ToFloat(x[r * 2 * ffn + ffn + c]);
    y[i] = FromFloat<T>(g * Sigmoid(g) * u);
  }
}

template <typename T>
__global__ void SwiGluBackwardKernel(const T* dy, const T* x, std::int64_t rows, std::int64_t ffn,
                                     T* dx) {
  const std::int64_t n = rows * ffn;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t r = i / ffn;
    const std::int64_t c = i % ffn;
    const std::int64_t gate = r * 2 * ffn + c;
    const float g = ToFloat(x[gate]);
    const float u = ToFloat(x[gate + ffn]);
    const float sig = Sigmoid(g);
    const float d = ToFloat(dy[i]);
    // d silu(g) / dg = sig * (1 + g * (1 - sig)).
    dx[gate] = FromFloat<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dx[gate + ffn] = FromFloat<T>(d * g * sig);
  }
}

template <typename T>
__global__ void GeluForwardKernel(const T* x, std::int64_t n, T* y) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = ToFloat(x[i]);
    y[i] = FromFloat<T>(0.5f * v * (1.0f + tanhf(kGeluK * (v + kGeluC * v * v * v))));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(const T* dy, const T* x, std::int64_t n, T* dx) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = ToFloat(x[i]);
    const float t = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float grad =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    dx[i] = FromFloat<T>(ToFloat(dy[i]) * grad);
  }
}

}  // namespace

cudaError_t SwiGluForward(cudaStream_t stream, Storage t, const void* x, std::int64_t rows,
                          std::int64_t ffn, void* y) {
  if (rows <= 0 || ffn <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(SwiGluForwardKernel<T>, GridFor(rows * ffn), kThreads, 0, stream,
                  static_cast<const T*>(x), rows, ffn, static_cast<T*>(y));
  });
}

cudaError_t SwiGluBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                           std::int64_t rows, std::int64_t ffn, void* dx) {
  if (rows <= 0 || ffn <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(SwiGluBackwardKernel<T>, GridFor(rows * ffn), kThreads, 0, stream,
                  static_cast<const T*>(dy), static_cast<const T*>(x), rows, ffn,
                  static_cast<T*>(dx));
  });
}

cudaError_t GeluForward(cudaStream_t stream, Storage t, const void* x, std::int64_t n, void* y) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(GeluForwardKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<const T*>(x),
                  n, static_cast<T*>(y));
  });
}

cudaError_t GeluBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                         std::int64_t n, void* dx) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(GeluBackwardKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<const T*>(dy),
                  static_cast<const T*>(x), n, static_cast<T*>(dx));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
