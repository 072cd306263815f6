// RMSNorm and LayerNorm over the last dimension (ref: kernels/norms.h).
//
// Forward and the input gradient run one block per row: the row's statistics are block
// reductions in float, then the row is read again (from L2) to write its output. The parameter
// gradients sum over rows, so they run as a separate column kernel: each block owns 32 columns and
// a slice of the rows, reduces its slice in shared memory, and adds it into the fp32 dgamma/dbeta
// with one atomicAdd per column (the accumulation order across blocks is not fixed, so the last
// bits of dgamma may differ between runs).
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowGroups = 8;  // threads per column in a parameter-gradient block

template <typename T>
__global__ void RmsNormForwardKernel(const T* x, const T* gamma, std::int64_t hidden, float eps,
                                     T* y, float* rstd) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  T* yr = y + row * hidden;
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
__global__ void LayerNormForwardKernel(const T* x, const T* gamma, const T* beta,
                                       std::int64_t hidden, float eps, T* y, float* mean,
                                       float* rstd) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  T* yr = y + row * hidden;
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

// dx of both norms; mean == nullptr selects RMSNorm (xhat = x * rstd, no mean(g) term).
template <typename T>
__global__ void NormBackwardDxKernel(const T* dy, const T* x, const T* gamma, const float* mean,
                                     const float* rstd, std::int64_t hidden, T* dx) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  const T* dyr = dy + row * hidden;
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
    dx[row * hidden + i] = FromFloat<T>(inv * (g - mean_g - xhat * mean_g_xhat));
  }
}

// dgamma[c] += sum_r dy[r, c] * xhat[r, c]; dbeta[c] += sum_r dy[r, c] (LayerNorm only).
// Block (32, kRowGroups): threadIdx.x picks the column, so a warp reads 32 consecutive elements.
template <typename T>
__global__ void NormBackwardParamsKernel(const T* dy, const T* x, const float* mean,
                                         const float* rstd, std::int64_t rows, std::int64_t hidden,
                                         float* dgamma, float* dbeta) {
  __shared__ float part_gamma[kRowGroups][kColumnsPerBlock + 1];
  __shared__ float part_beta[kRowGroups][kColumnsPerBlock + 1];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  float acc_gamma = 0.0f;
  float acc_beta = 0.0f;
  if (col < hidden) {
    const std::int64_t row_step = static_cast<std::int64_t>(gridDim.y) * kRowGroups;
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kRowGroups + threadIdx.y;
         r < rows; r += row_step) {
      const float d = ToFloat(dy[r * hidden + col]);
      const float mu = mean != nullptr ? mean[r] : 0.0f;
      acc_gamma += d * (ToFloat(x[r * hidden + col]) - mu) * rstd[r];
      acc_beta += d;
    }
  }
  part_gamma[threadIdx.y][threadIdx.x] = acc_gamma;
  part_beta[threadIdx.y][threadIdx.x] = acc_beta;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
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
                         const float* rstd, std::int64_t rows, std::int64_t hidden, float* dgamma,
                         float* dbeta) {
  // Enough row slices to keep every SM busy even when hidden is narrow; each slice is at least
  // 64 rows so the atomics stay few.
  const std::int64_t slices = std::clamp<std::int64_t>((rows + 63) / 64, 1, 512);
  const dim3 grid(static_cast<unsigned>((hidden + kColumnsPerBlock - 1) / kColumnsPerBlock),
                  static_cast<unsigned>(slices));
  const dim3 block(kColumnsPerBlock, kRowGroups);
  return Launch(NormBackwardParamsKernel<T>, grid, block, 0, stream, dy, x, mean, rstd, rows,
                hidden, dgamma, dbeta);
}

}  // namespace

cudaError_t RmsNormForward(cudaStream_t stream, Storage t, const void* x, const void* gamma,
                           std::int64_t rows, std::int64_t hidden, float eps, void* y,
                           float* rstd) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(RmsNormForwardKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream,
                  static_cast<const T*>(x), static_cast<const T*>(gamma), hidden, eps,
                  static_cast<T*>(y), rstd);
  });
}

cudaError_t RmsNormBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                            const void* gamma, const float* rstd, std::int64_t rows,
                            std::int64_t hidden, void* dx, float* dgamma) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    // Parameter gradients first: they read dy and x, which dx may overwrite.
    const cudaError_t rc =
        LaunchParams<T>(stream, pdy, px, nullptr, rstd, rows, hidden, dgamma, nullptr);
    if (rc != cudaSuccess) return rc;
    return Launch(NormBackwardDxKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream, pdy,
                  px, static_cast<const T*>(gamma), nullptr, rstd, hidden, static_cast<T*>(dx));
  });
}

cudaError_t LayerNormForward(cudaStream_t stream, Storage t, const void* x, const void* gamma,
                             const void* beta, std::int64_t rows, std::int64_t hidden, float eps,
                             void* y, float* mean, float* rstd) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(LayerNormForwardKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream,
                  static_cast<const T*>(x), static_cast<const T*>(gamma),
                  static_cast<const T*>(beta), hidden, eps, static_cast<T*>(y), mean, rstd);
  });
}

cudaError_t LayerNormBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                              const void* gamma, const float* mean, const float* rstd,
                              std::int64_t rows, std::int64_t hidden, void* dx, float* dgamma,
                              float* dbeta) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const cudaError_t rc =
        LaunchParams<T>(stream, pdy, px, mean, rstd, rows, hidden, dgamma, dbeta);
    if (rc != cudaSuccess) return rc;
    return Launch(NormBackwardDxKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream, pdy,
                  px, static_cast<const T*>(gamma), mean, rstd, hidden, static_cast<T*>(dx));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
