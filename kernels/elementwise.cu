// Fills, conversions, elementwise arithmetic and whole-tensor reductions.
#include "kernels/cuda_common.cuh"
#include "kernels/init.h"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename T>
__global__ void FillKernel(T* x, std::int64_t n, float value) {
  const T v = FromFloat<T>(value);
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) x[i] = v;
}

// ref::HashUniform is constexpr, hence callable here (--expt-relaxed-constexpr): the very same
// integer arithmetic and one exact float conversion as on the host, then the same single float
// multiply by scale, so the bits agree with CpuDevice::FillHash.
template <typename T>
__global__ void FillHashKernel(T* x, std::uint64_t seed, float scale, std::int64_t rows,
                               std::int64_t cols, std::int64_t global_cols, std::int64_t row_offset,
                               std::int64_t col_offset) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t r = i / cols;
    const std::int64_t c = i % cols;
    const std::uint64_t base =
        static_cast<std::uint64_t>((row_offset + r) * global_cols + col_offset);
    x[i] = FromFloat<T>(scale * ref::HashUniform(seed, base + static_cast<std::uint64_t>(c)));
  }
}

template <typename D, typename S>
__global__ void ConvertKernel(D* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    dst[i] = FromFloat<D>(ToFloat(src[i]));
  }
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* out, std::int64_t n) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

template <typename T>
__global__ void AxpyKernel(float alpha, const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    // Explicit rounding steps: no fused multiply-add, so f32 results equal the host's bit for bit.
    y[i] = FromFloat<T>(__fadd_rn(ToFloat(y[i]), __fmul_rn(alpha, ToFloat(x[i]))));
  }
}

template <typename T>
__global__ void DropoutAddKernel(const T* x, const T* residual, T* out, std::uint8_t* mask,
                                 std::int64_t n, std::uint64_t seed, std::uint32_t threshold,
                                 float scale) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const bool keep = ref::DropoutKeeps(seed, static_cast<std::uint64_t>(i), threshold);
    mask[i] = keep ? 1 : 0;
    const float kept = keep ? __fmul_rn(ToFloat(x[i]), scale) : 0.0f;
    out[i] = FromFloat<T>(__fadd_rn(ToFloat(residual[i]), kept));
  }
}

template <typename T>
__global__ void DropoutBackwardKernel(const T* dy, const std::uint8_t* mask, T* dx, std::int64_t n,
                                      float scale) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    dx[i] = FromFloat<T>(mask[i] != 0 ? __fmul_rn(ToFloat(dy[i]), scale) : 0.0f);
  }
}

template <typename T>
__global__ void ScaleKernel(T* x, std::int64_t n, float alpha) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    x[i] = FromFloat<T>(ToFloat(x[i]) * alpha);
  }
}

template <typename T>
__global__ void ScaleMatrixKernel(T* c, std::int64_t batch, std::int64_t rows, std::int64_t cols,
                                  std::int64_t ld, std::int64_t stride, float beta) {
  const std::int64_t per_matrix = rows * cols;
  const std::int64_t n = batch * per_matrix;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t b = i / per_matrix;
    const std::int64_t r = (i % per_matrix) / cols;
    const std::int64_t col = i % cols;
    T* p = c + b * stride + r * ld + col;
    // beta == 0 must not propagate NaN garbage, as BLAS does not read C then.
    *p = FromFloat<T>(beta == 0.0f ? 0.0f : beta * ToFloat(*p));
  }
}

// Stage 1: block b writes the double sum of its grid-stride share to partials[b]. The grid size
// depends on n only, so the summation order, and the result, is reproducible.
template <typename T>
__global__ void SumSquaresPartialKernel(const T* x, std::int64_t n, double* partials) {
  __shared__ double warp_sums[kThreads / kWarpSize];
  double acc = 0.0;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const double v = ToFloat(x[i]);
    acc += v * v;
  }
  acc = WarpSumDouble(acc);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / kWarpSize; ++w) total += warp_sums[w];
    partials[blockIdx.x] = total;
  }
}

// Stage 2: one thread adds the partials in block order.
__global__ void SumSquaresFinalKernel(const double* partials, int count, float* sum) {
  double total = 0.0;
  for (int b = 0; b < count; ++b) total += partials[b];
  sum[0] = static_cast<float>(static_cast<double>(sum[0]) + total);
}

template <typename T>
__global__ void FindNonfiniteKernel(const T* x, std::int64_t n, unsigned long long* first_bad) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    if (!isfinite(ToFloat(x[i]))) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

}  // namespace

cudaError_t Fill(cudaStream_t stream, Storage t, void* x, std::int64_t n, float value) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(FillKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<T*>(x), n, value);
  });
}

cudaError_t FillHash(cudaStream_t stream, Storage t, void* x, std::uint64_t seed, float scale,
                     std::int64_t rows, std::int64_t cols, std::int64_t global_cols,
                     std::int64_t row_offset, std::int64_t col_offset) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(FillHashKernel<T>, GridFor(rows * cols), kThreads, 0, stream, static_cast<T*>(x),
                  seed, scale, rows, cols, global_cols, row_offset, col_offset);
  });
}

cudaError_t Convert(cudaStream_t stream, Storage dst_t, void* dst, Storage src_t, const void* src,
                    std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(dst_t, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return Dispatch(src_t, [&](auto src_tag) {
      using S = decltype(src_tag);
      return Launch(ConvertKernel<D, S>, GridFor(n), kThreads, 0, stream, static_cast<D*>(dst),
                    static_cast<const S*>(src), n);
    });
  });
}

cudaError_t Add(cudaStream_t stream, Storage t, const void* a, const void* b, void* out,
                std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(AddKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<const T*>(a),
                  static_cast<const T*>(b), static_cast<T*>(out), n);
  });
}

cudaError_t DropoutAdd(cudaStream_t stream, Storage t, const void* x, const void* residual,
                       void* out, std::uint8_t* mask, std::int64_t n, std::uint64_t seed,
                       std::uint32_t threshold, float scale) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(DropoutAddKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<const T*>(x),
                  static_cast<const T*>(residual), static_cast<T*>(out), mask, n, seed, threshold,
                  scale);
  });
}

cudaError_t DropoutBackward(cudaStream_t stream, Storage t, const void* dy,
                            const std::uint8_t* mask, void* dx, std::int64_t n, float scale) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(DropoutBackwardKernel<T>, GridFor(n), kThreads, 0, stream,
                  static_cast<const T*>(dy), mask, static_cast<T*>(dx), n, scale);
  });
}

cudaError_t Axpy(cudaStream_t stream, Storage t, float alpha, const void* x, void* y,
                 std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(AxpyKernel<T>, GridFor(n), kThreads, 0, stream, alpha, static_cast<const T*>(x),
                  static_cast<T*>(y), n);
  });
}

cudaError_t Scale(cudaStream_t stream, Storage t, void* x, std::int64_t n, float alpha) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(ScaleKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<T*>(x), n, alpha);
  });
}

cudaError_t ScaleMatrix(cudaStream_t stream, Storage t, void* c, std::int64_t batch,
                        std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride,
                        float beta) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(ScaleMatrixKernel<T>, GridFor(batch * rows * cols), kThreads, 0, stream,
                  static_cast<T*>(c), batch, rows, cols, ld, stride, beta);
  });
}

cudaError_t SumSquares(cudaStream_t stream, Storage t, const void* x, std::int64_t n, float* sum,
                       double* partials) {
  if (n <= 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<unsigned>(GridFor(n), kSumSquaresPartials));
  const cudaError_t rc = Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(SumSquaresPartialKernel<T>, blocks, kThreads, 0, stream, static_cast<const T*>(x),
                  n, partials);
  });
  if (rc != cudaSuccess) return rc;
  return Launch(SumSquaresFinalKernel, 1, 1, 0, stream, partials, blocks, sum);
}

cudaError_t FindNonfinite(cudaStream_t stream, Storage t, const void* x, std::int64_t n,
                          unsigned long long* first_bad) {
  // All ones is UINT64_MAX: "nothing found" unless the kernel lowers it.
  const cudaError_t rc = MemsetAsync(first_bad, 0xff, sizeof(*first_bad), stream);
  if (rc != cudaSuccess || n <= 0) return rc;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(FindNonfiniteKernel<T>, GridFor(n), kThreads, 0, stream, static_cast<const T*>(x),
                  n, first_bad);
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
