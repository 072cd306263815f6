// RMSNorm and LayerNorm over vectors of `hidden` elements, rows × vectors of them, each at its
// place in strided rows (ref: kernels/norms.h, NormLayout).
//
// Forward and the input gradient run one block per vector: the vector's statistics are block
// reductions in float, then the vector is read again (from L2) to write its output. The parameter
// gradients sum over vectors, so they run as a separate column kernel: each block owns 32 columns
// and a slice of the vectors, reduces its slice in shared memory, and adds it into the fp32
// dgamma/dbeta with one atomicAdd per column (the accumulation order across blocks is not fixed,
// so the last bits of dgamma may differ between runs).
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowGroups = 8;  // threads per column in a parameter-gradient block

// Where the vectors lie (NormArgs with the strides resolved), as the kernels take it.
struct Layout {
  std::int64_t hidden, vectors, x_stride, y_stride;
};

// Offset of vector `vec` (= r * vectors + v) in an operand whose rows lie `stride` apart.
__device__ __forceinline__ std::int64_t VectorOffset(const Layout& l, std::int64_t vec,
                                                     std::int64_t stride) {
  if (l.vectors == 1) return vec * stride;  // the plain norm: no 64-bit division
  return vec / l.vectors * stride + vec % l.vectors * l.hidden;
}

template <typename T>
__global__ void RmsNormForwardKernel(const T* x, const T* gamma, Layout l, float eps, T* y,
                                     float* rstd) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;  // the vector
  const std::int64_t hidden = l.hidden;
  const T* xr = x + VectorOffset(l, row, l.x_stride);
  T* yr = y + VectorOffset(l, row, l.y_stride);
  float sum_sq = 0.0f;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = ToFloat(xr[i]);
    sum_sq += v * v;
  }
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[row] = inv;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    yr[i] = FromFloat<T>(ToFloat(xr[i]) * inv * ToFloat(gamma[i]));
  }
}

template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* gamma, const T* beta, Layout l,
                                       float eps, T* y, float* mean, float* rstd) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;  // the vector
  const std::int64_t hidden = l.hidden;
  const T* xr = x + VectorOffset(l, row, l.x_stride);
  T* yr = y + VectorOffset(l, row, l.y_stride);
  float sum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) sum += ToFloat(xr[i]);
  const float mu = BlockSum(sum, scratch) / static_cast<float>(hidden);
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  float var = 0.0f;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float d = ToFloat(xr[i]) - mu;
    var += d * d;
  }
  var = BlockSum(var, scratch) / static_cast<float>(hidden);
  const float inv = 1.0f / sqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = inv;
  }
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    yr[i] = FromFloat<T>((ToFloat(xr[i]) - mu) * inv * ToFloat(gamma[i]) + ToFloat(beta[i]));
  }
}

// dx of both norms; mean == nullptr selects RMSNorm (xhat = x * rstd, no mean(g) term). dx may
// alias dy: each thread reads dy[i] before it writes dx[i], and only it touches element i.
template <typename T>
__global__ void NormBackwardDxKernel(const T* dy, const T* x, const T* gamma, const float* mean,
                                     const float* rstd, Layout l, T* dx) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;  // the vector
  const std::int64_t hidden = l.hidden;
  const T* xr = x + VectorOffset(l, row, l.x_stride);
  const T* dyr = dy + VectorOffset(l, row, l.y_stride);
  T* dxr = dx + VectorOffset(l, row, l.y_stride);
  const float mu = mean != nullptr ? mean[row] : 0.0f;
  const float inv = rstd[row];
  float sum_g = 0.0f;
  float sum_g_xhat = 0.0f;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float g = ToFloat(dyr[i]) * ToFloat(gamma[i]);
    sum_g += g;
    sum_g_xhat += g * (ToFloat(xr[i]) - mu) * inv;
  }
  const float n = static_cast<float>(hidden);
  const float mean_g = mean != nullptr ? BlockSum(sum_g, scratch) / n : 0.0f;
  const float mean_g_xhat = BlockSum(sum_g_xhat, scratch) / n;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float xhat = (ToFloat(xr[i]) - mu) * inv;
    const float g = ToFloat(dyr[i]) * ToFloat(gamma[i]);
    dxr[i] = FromFloat<T>(inv * (g - mean_g - xhat * mean_g_xhat));
  }
}

// dgamma[c] += sum_r dy[r, c] * xhat[r, c]; dbeta[c] += sum_r dy[r, c] (LayerNorm only), r over
// the `count` vectors. Block (32, kRowGroups): threadIdx.x picks the column, so a warp reads 32
// consecutive elements.
template <typename T>
__global__ void NormBackwardParamsKernel(const T* dy, const T* x, const float* mean,
                                         const float* rstd, std::int64_t count, Layout l,
                                         float* dgamma, float* dbeta) {
  __shared__ float part_gamma[kRowGroups][kColumnsPerBlock + 1];
  __shared__ float part_beta[kRowGroups][kColumnsPerBlock + 1];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  float acc_gamma = 0.0f;
  float acc_beta = 0.0f;
  if (col < l.hidden) {
    const std::int64_t row_step = static_cast<std::int64_t>(gridDim.y) * kRowGroups;
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kRowGroups + threadIdx.y;
         r < count; r += row_step) {
      const float d = ToFloat(dy[VectorOffset(l, r, l.y_stride) + col]);
      const float mu = mean != nullptr ? mean[r] : 0.0f;
      acc_gamma += d * (ToFloat(x[VectorOffset(l, r, l.x_stride) + col]) - mu) * rstd[r];
      acc_beta += d;
    }
  }
  part_gamma[threadIdx.y][threadIdx.x] = acc_gamma;
  part_beta[threadIdx.y][threadIdx.x] = acc_beta;
  __syncthreads();
  if (threadIdx.y == 0 && col < l.hidden) {
    float total_gamma = 0.0f;
    float total_beta = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) {
      total_gamma += part_gamma[g][threadIdx.x];
      total_beta += part_beta[g][threadIdx.x];
    }
    atomicAdd(dgamma + col, total_gamma);
    if (dbeta != nullptr) atomicAdd(dbeta + col, total_beta);
  }
}

template <typename T>
cudaError_t LaunchParams(cudaStream_t stream, const T* dy, const T* x, const float* mean,
                         const float* rstd, std::int64_t count, const Layout& l, float* dgamma,
                         float* dbeta) {
  // Enough vector slices to keep every SM busy even when hidden is narrow; each slice is at least
  // 64 vectors so the atomics stay few.
  const std::int64_t slices = std::clamp<std::int64_t>((count + 63) / 64, 1, 512);
  const dim3 grid(static_cast<unsigned>((l.hidden + kColumnsPerBlock - 1) / kColumnsPerBlock),
                  static_cast<unsigned>(slices));
  const dim3 block(kColumnsPerBlock, kRowGroups);
  return Launch(NormBackwardParamsKernel<T>, grid, block, 0, stream, dy, x, mean, rstd, count, l,
                dgamma, dbeta);
}

Layout ToLayout(const NormArgs& a) { return Layout{a.hidden, a.vectors, a.x_stride, a.y_stride}; }

// Vectors of a call: one block each.
std::int64_t VectorCount(const NormArgs& a) { return a.rows * a.vectors; }

}  // namespace

cudaError_t RmsNormForward(cudaStream_t stream, Storage t, const NormArgs& args, const void* x,
                           const void* gamma, float eps, void* y, float* rstd) {
  const std::int64_t count = VectorCount(args);
  if (count <= 0 || args.hidden <= 0) return cudaSuccess;
  if (!FitsGridX(count)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(RmsNormForwardKernel<T>, static_cast<unsigned>(count), kThreads, 0, stream,
                  static_cast<const T*>(x), static_cast<const T*>(gamma), ToLayout(args), eps,
                  static_cast<T*>(y), rstd);
  });
}

cudaError_t RmsNormBackward(cudaStream_t stream, Storage t, const NormArgs& args, const void* dy,
                            const void* x, const void* gamma, const float* rstd, void* dx,
                            float* dgamma) {
  const std::int64_t count = VectorCount(args);
  if (count <= 0 || args.hidden <= 0) return cudaSuccess;
  if (!FitsGridX(count)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const Layout l = ToLayout(args);
    // Parameter gradients first: they read dy and x, which dx may overwrite.
    const cudaError_t rc =
        LaunchParams<T>(stream, pdy, px, nullptr, rstd, count, l, dgamma, nullptr);
    if (rc != cudaSuccess) return rc;
    return Launch(NormBackwardDxKernel<T>, static_cast<unsigned>(count), kThreads, 0, stream, pdy,
                  px, static_cast<const T*>(gamma), nullptr, rstd, l, static_cast<T*>(dx));
  });
}

cudaError_t LayerNormForward(cudaStream_t stream, Storage t, const NormArgs& args, const void* x,
                             const void* gamma, const void* beta, float eps, void* y, float* mean,
                             float* rstd) {
  const std::int64_t count = VectorCount(args);
  if (count <= 0 || args.hidden <= 0) return cudaSuccess;
  if (!FitsGridX(count)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(LayerNormForwardKernel<T>, static_cast<unsigned>(count), kThreads, 0, stream,
                  static_cast<const T*>(x), static_cast<const T*>(gamma),
                  static_cast<const T*>(beta), ToLayout(args), eps, static_cast<T*>(y), mean, rstd);
  });
}

cudaError_t LayerNormBackward(cudaStream_t stream, Storage t, const NormArgs& args, const void* dy,
                              const void* x, const void* gamma, const float* mean,
                              const float* rstd, void* dx, float* dgamma, float* dbeta) {
  const std::int64_t count = VectorCount(args);
  if (count <= 0 || args.hidden <= 0) return cudaSuccess;
  if (!FitsGridX(count)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const Layout l = ToLayout(args);
    const cudaError_t rc = LaunchParams<T>(stream, pdy, px, mean, rstd, count, l, dgamma, dbeta);
    if (rc != cudaSuccess) return rc;
    return Launch(NormBackwardDxKernel<T>, static_cast<unsigned>(count), kThreads, 0, stream, pdy,
                  px, static_cast<const T*>(gamma), mean, rstd, l, static_cast<T*>(dx));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
