// Device-side helpers shared by kernels/*.cu: float <-> storage conversion, warp and block
// reductions, grid sizing, dispatch on the storage type, and the few runtime calls the launchers
// make (Launch, MemsetAsync, AllowDynamicShared). Included by .cu files only.
//
// Host emulation: with AUTOPAR_KERNEL_EMULATION defined, tests/unit/cuda_emulation.h (included
// first) supplies those runtime calls and the device built-ins (threadIdx, __syncthreads, warp
// shuffles, atomics) on the host, one std::thread per CUDA thread, and a plain C++ compiler builds
// the very kernels and launchers of kernels/*.cu. That is how the kernels' index math and
// synchronisation are tested on machines without a GPU (tests/unit/cuda_emulation_test.cc).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_kernels.cuh"

// The emulated kernels live in a namespace of their own, so that they and the real ones, linked
// into the same test binary, never share a symbol.
#if defined(AUTOPAR_KERNEL_EMULATION)
#define AUTOPAR_CUDA_KERNELS_NS autopar::kernels::cuda::emulated
#else
#define AUTOPAR_CUDA_KERNELS_NS autopar::kernels::cuda
#include <cuda_runtime.h>
#endif

namespace AUTOPAR_CUDA_KERNELS_NS {

#if !defined(AUTOPAR_KERNEL_EMULATION)
// Launch arguments convert to the kernel's parameter types at the call, as with <<<>>>.
template <typename T>
struct LaunchArg {
  using type = T;
};

// kernel<<<grid, block, shared_bytes, stream>>>(args...), returning the launch status.
template <typename... Params>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                   cudaStream_t stream, typename LaunchArg<Params>::type... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
  return cudaGetLastError();
}

inline cudaError_t MemsetAsync(void* data, int value, std::size_t bytes, cudaStream_t stream) {
  return cudaMemsetAsync(data, value, bytes, stream);
}

// Dynamic shared memory past the default 48 KiB must be opted into per kernel.
template <typename... Params>
cudaError_t AllowDynamicShared(void (*kernel)(Params...), int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The block's dynamic shared memory (the launch's shared_bytes), as floats.
__device__ __forceinline__ float* DynamicShared() {
  extern __shared__ float autopar_dynamic_shared[];
  return autopar_dynamic_shared;
}
#endif

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

// Kernels that put rows on blockIdx.x need rows below 2^31.
inline bool FitsGridX(std::int64_t n) { return n > 0 && n <= 0x7fffffff; }

// Calls f(T{}) with T the storage type: `return Dispatch(t, [&](auto tag) { using T =
// decltype(tag); ... })`.
template <typename F>
cudaError_t Dispatch(Storage t, F&& f) {
  if (t == Storage::kBF16) return f(__nv_bfloat16{});
  return f(float{});
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
