// Device-side helpers shared by kernels/*.cu: float <-> storage conversion, warp and block
// reductions, grid sizing and dispatch on the storage type. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda_kernels.cuh"

namespace autopar::kernels::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Arithmetic is float; memory is float or bf16 (round to nearest even on the way in, as the
// host's __float2bfloat16 does, so host references can round the same way).
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

__device__ __forceinline__ double WarpSumDouble(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(kFullMask, v, offset);
  }
  return v;
}

// Sum or max over the block, returned to every thread. `scratch` holds one value per warp and
// may be reused right after the call returns (the trailing barrier protects it). Every thread of
// the block must call it.
template <typename Op>
__device__ __forceinline__ float BlockReduce(float v, float* scratch, Op op, float identity) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>((blockDim.x + kWarpSize - 1) / kWarpSize);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = identity;
  for (int w = 0; w < warps; ++w) total = op(total, scratch[w]);
  __syncthreads();
  return total;
}

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  return BlockReduce(v, scratch, SumOp{}, 0.0f);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  return BlockReduce(v, scratch, MaxOp{}, -INFINITY);
}

// Grid-stride loops: enough blocks to fill a large GPU several times over, never more than the
// work needs. Indices are 64-bit throughout (tensors pass 2^31 elements).
constexpr int kThreads = 256;
inline unsigned GridFor(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 65536));
}
__device__ __forceinline__ std::int64_t GlobalThread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t GridThreads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// Calls f(T{}) with T the storage type: `return Dispatch(t, [&](auto tag) { using T =
// decltype(tag); ... })`.
template <typename F>
cudaError_t Dispatch(Storage t, F&& f) {
  if (t == Storage::kBF16) return f(__nv_bfloat16{});
  return f(float{});
}

}  // namespace autopar::kernels::cuda
