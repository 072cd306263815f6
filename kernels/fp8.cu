// FP8 quantization for the cuBLASLt FP8 GEMM: amax, scale, saturating cast (and transpose).
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_fp8.cuh"
#include "kernels/fp8_scale.h"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

constexpr int kTile = 32;     // transpose tile
constexpr int kTileRows = 8;  // threads per tile column: each covers kTile / kTileRows rows

// amax |x| over the view; the block's maximum goes into amax_bits with atomicMax on the bits.
template <typename T>
__global__ void AmaxKernel(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           unsigned int* amax_bits) {
  __shared__ float scratch[kThreads / kWarpSize];
  float local = 0.0f;
  const std::int64_t n = rows * cols;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    // fmaxf drops NaN: a NaN element does not spoil the scale of the others, and the step's
    // finiteness check reports it.
    local = fmaxf(local, fabsf(ToFloat(x[(i / cols) * ld + i % cols])));
  }
  const float block = BlockMax(local, scratch);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(block));
}

__global__ void ScaleKernel(Fp8Scales* scales, float fp8_max) {
  const float scale = Fp8ScaleFromAmax(__uint_as_float(scales->amax_bits), fp8_max);
  scales->scale = scale;
  scales->scale_inv = 1.0f / scale;
}

// One kTile x kTile tile per block through shared memory, so both the reads and the (possibly
// transposed) writes are coalesced.
template <typename T>
__global__ void CastKernel(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           bool transpose, __nv_fp8_interpretation_t format,
                           const Fp8Scales* scales, __nv_fp8_storage_t* out) {
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 1];
  const float scale = scales->scale;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.y) * kTile;
  const std::int64_t col0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    const std::int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) {
      tile[r][threadIdx.x] =
          __nv_cvt_float_to_fp8(ToFloat(x[row * ld + col]) * scale, __NV_SATFINITE, format);
    }
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    if (transpose) {  // out [cols, rows]: tile column r becomes an output row
      const std::int64_t out_row = col0 + r, out_col = row0 + threadIdx.x;
      if (out_row < cols && out_col < rows) out[out_row * rows + out_col] = tile[threadIdx.x][r];
    } else {
      const std::int64_t row = row0 + r, col = col0 + threadIdx.x;
      if (row < rows && col < cols) out[row * cols + col] = tile[r][threadIdx.x];
    }
  }
}

}  // namespace

cudaError_t QuantizeFp8(cudaStream_t stream, Storage t, const void* x, std::int64_t rows,
                        std::int64_t cols, std::int64_t ld, bool transpose, Fp8Format format,
                        Fp8Scales* scales, void* out) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const std::int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
  if (!FitsGridX(tiles_x) || tiles_y > 65535) return cudaErrorInvalidConfiguration;
  cudaError_t rc = MemsetAsync(&scales->amax_bits, 0, sizeof(scales->amax_bits), stream);
  if (rc != cudaSuccess) return rc;
  rc = Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(AmaxKernel<T>, GridFor(rows * cols), kThreads, 0, stream,
                  static_cast<const T*>(x), rows, cols, ld, &scales->amax_bits);
  });
  if (rc != cudaSuccess) return rc;
  const bool e4m3 = format == Fp8Format::kE4M3;
  rc = Launch(ScaleKernel, 1, 1, 0, stream, scales, e4m3 ? kFp8E4M3Max : kFp8E5M2Max);
  if (rc != cudaSuccess) return rc;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(
        CastKernel<T>, dim3(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y)),
        dim3(kTile, kTileRows), 0, stream, static_cast<const T*>(x), rows, cols, ld, transpose,
        e4m3 ? __NV_E4M3 : __NV_E5M2, scales, static_cast<__nv_fp8_storage_t*>(out));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
