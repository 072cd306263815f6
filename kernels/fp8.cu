// FP8 quantization for the cuBLASLt FP8 GEMM: amax, scale, saturating cast (and transpose).
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_fp8.cuh"
#include "kernels/fp8_scale.h"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

constexpr int kTile = 32;     // transpose tile
constexpr int kTileRows = 8;  // threads per tile column: each covers kTile / kTileRows rows

// The amax reduction's grid: blocks along the rows (x) and chunks of kThreads columns (y), at
// most kAmaxBlocks in all. A few blocks per SM fill a large GPU; each block adds one atomicMax
// on the same word, so their number also bounds that contention (one block per 256 elements,
// up to 65536 of them, serialized on the word, cost more than the reading).
constexpr std::int64_t kAmaxBlocks = 1024;
constexpr std::int64_t kAmaxColumnChunks = 32;
inline dim3 AmaxGrid(std::int64_t rows, std::int64_t cols) {
  const std::int64_t chunks =
      std::min<std::int64_t>((cols + kThreads - 1) / kThreads, kAmaxColumnChunks);
  const std::int64_t row_blocks =
      std::clamp<std::int64_t>(kAmaxBlocks / chunks, 1, std::min<std::int64_t>(rows, 65535));
  return dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(chunks));
}

// amax |x| over the view (rows on blockIdx.x, columns on blockIdx.y and the threads, so a warp
// reads consecutive elements of a row and no index is divided); the block's maximum goes into
// amax_bits with atomicMax on the bits. Four rows at a time, so each thread has four loads in
// flight (one would leave a GPU's memory mostly idle at this grid's size). fmaxf drops NaN: a NaN
// element does not spoil the scale of the others, and the step's finiteness check reports it.
template <typename T>
__global__ void AmaxKernel(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                           unsigned int* amax_bits) {
  __shared__ float scratch[kThreads / kWarpSize];
  float local = 0.0f;
  const std::int64_t first_col = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const std::int64_t col_step = static_cast<std::int64_t>(gridDim.y) * blockDim.x;
  const std::int64_t row_step = gridDim.x;
  std::int64_t r = blockIdx.x;
  for (; r + 3 * row_step < rows; r += 4 * row_step) {
    const T* r0 = x + r * ld;
    const T* r1 = r0 + row_step * ld;
    const T* r2 = r1 + row_step * ld;
    const T* r3 = r2 + row_step * ld;
    for (std::int64_t c = first_col; c < cols; c += col_step) {
      const float m01 = fmaxf(fabsf(ToFloat(r0[c])), fabsf(ToFloat(r1[c])));
      const float m23 = fmaxf(fabsf(ToFloat(r2[c])), fabsf(ToFloat(r3[c])));
      local = fmaxf(local, fmaxf(m01, m23));
    }
  }
  for (; r < rows; r += row_step) {
    for (std::int64_t c = first_col; c < cols; c += col_step) {
      local = fmaxf(local, fabsf(ToFloat(x[r * ld + c])));
    }
  }
  const float block = BlockMax(local, scratch);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(block));
}

__global__ void Fp8ScaleKernel(Fp8Scales* scales, float fp8_max) {
  const float scale = Fp8ScaleFromAmax(__uint_as_float(scales->amax_bits), fp8_max);
  scales->scale = scale;
  scales->scale_inv = 1.0f / scale;
}

// The cast with a transpose (or of rows that are not whole words): one kTile x kTile tile per
// block through shared memory, so both the reads and the (possibly transposed) writes are
// coalesced.
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

// The cast without a transpose, for a view of cols a multiple of 4 (every FP8 GEMM operand: its
// sizes are multiples of 16) into a 4-byte aligned `out`: each thread casts 4 consecutive
// elements of a row and stores them as one word; rows on blockIdx.x, a row's words on blockIdx.y
// and the threads. No shared memory and no barrier: at a GEMM operand's size the tile kernel
// above moved a third of what the amax reduction did (ncu on an H200: 0.7-0.9 against 2.0-2.5
// TB/s).
constexpr std::int64_t kCastColumnChunks = 64;
template <typename T>
__global__ void CastRowsKernel(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                               __nv_fp8_interpretation_t format, const Fp8Scales* scales,
                               std::uint32_t* out) {
  const float scale = scales->scale;
  const std::int64_t words = cols / 4;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * blockDim.x;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * ld;
    for (std::int64_t w = first; w < words; w += step) {
      std::uint32_t packed = 0;
      for (int i = 0; i < 4; ++i) {
        const __nv_fp8_storage_t byte =
            __nv_cvt_float_to_fp8(ToFloat(row[4 * w + i]) * scale, __NV_SATFINITE, format);
        packed |= static_cast<std::uint32_t>(byte) << (8 * i);  // little-endian: byte i first
      }
      out[r * words + w] = packed;
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
    return Launch(AmaxKernel<T>, AmaxGrid(rows, cols), kThreads, 0, stream,
                  static_cast<const T*>(x), rows, cols, ld, &scales->amax_bits);
  });
  if (rc != cudaSuccess) return rc;
  const bool e4m3 = format == Fp8Format::kE4M3;
  rc = Launch(Fp8ScaleKernel, 1, 1, 0, stream, scales, e4m3 ? kFp8E4M3Max : kFp8E5M2Max);
  if (rc != cudaSuccess) return rc;
  const __nv_fp8_interpretation_t fp8 = e4m3 ? __NV_E4M3 : __NV_E5M2;
  if (!transpose && cols % 4 == 0 && reinterpret_cast<std::uintptr_t>(out) % 4 == 0) {
    const std::int64_t chunks =
        std::min<std::int64_t>((cols / 4 + kThreads - 1) / kThreads, kCastColumnChunks);
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)),
                    static_cast<unsigned>(chunks));
    return Dispatch(t, [&](auto tag) {
      using T = decltype(tag);
      return Launch(CastRowsKernel<T>, grid, kThreads, 0, stream, static_cast<const T*>(x), rows,
                    cols, ld, fp8, scales, static_cast<std::uint32_t*>(out));
    });
  }
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(CastKernel<T>,
                  dim3(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y)),
                  dim3(kTile, kTileRows), 0, stream, static_cast<const T*>(x), rows, cols, ld,
                  transpose, fp8, scales, static_cast<__nv_fp8_storage_t*>(out));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
