// Host emulation of the CUDA execution model, to test kernels/*.cu without a GPU.
//
// Include this first, then the .cu files: a plain C++ compiler then builds the very kernels and
// launchers of the CUDA platform, in namespace autopar::kernels::cuda::emulated, running on host
// memory. A launch runs its blocks one after another; a block runs one std::thread per CUDA
// thread, so __syncthreads is a real barrier and a missing one shows up as a wrong answer, as it
// would on a GPU. Warps are 32 consecutive threads: a shuffle exchanges values through per-warp
// slots between two warp barriers (a shuffle that some lane of the warp never reaches deadlocks;
// on a GPU it is undefined). __shared__ variables become statics, one copy for the block's
// threads, which is sound because blocks never overlap. Streams are ignored: everything has
// finished when a launcher returns. What this cannot show: timing, occupancy, real shared-memory
// limits and the GPU's float intrinsics (expf, tanhf differ from the host's in the last bits).
#pragma once

#define AUTOPAR_KERNEL_EMULATION 1

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

// The CUDA headers define these for a host compiler as attributes it would warn about.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

namespace autopar::kernels::cuda::emulated {

struct Warp {
  explicit Warp(std::ptrdiff_t lanes) : barrier(lanes) {}
  std::barrier<> barrier;
  double slots[32] = {};
};

// Where the calling CUDA thread lives.
struct ThreadContext {
  std::barrier<>* block = nullptr;
  Warp* warp = nullptr;
  int lane = 0;
  float* shared = nullptr;
};
inline thread_local ThreadContext context;

}  // namespace autopar::kernels::cuda::emulated

// ---- device built-ins ----
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline void __syncthreads() { autopar::kernels::cuda::emulated::context.block->arrive_and_wait(); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  autopar::kernels::cuda::emulated::context.warp->barrier.arrive_and_wait();
}

template <typename V>
V __shfl_xor_sync(unsigned /*mask*/, V value, int lane_mask) {
  auto& c = autopar::kernels::cuda::emulated::context;
  c.warp->slots[c.lane] = static_cast<double>(value);  // exact for float and double
  c.warp->barrier.arrive_and_wait();
  const V other = static_cast<V>(c.warp->slots[c.lane ^ lane_mask]);
  c.warp->barrier.arrive_and_wait();  // nobody overwrites a slot before everyone has read
  return other;
}

inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value);
}

inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
  std::atomic_ref<unsigned long long> target(*address);
  unsigned long long old = target.load();
  while (value < old && !target.compare_exchange_weak(old, value)) {
  }
  return old;
}

inline unsigned atomicMax(unsigned* address, unsigned value) {
  std::atomic_ref<unsigned> target(*address);
  unsigned old = target.load();
  while (value > old && !target.compare_exchange_weak(old, value)) {
  }
  return old;
}

inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }

// IEEE single-precision operations with round to nearest: what the host does anyway (x86-64
// without FMA contraction).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }

namespace autopar::kernels::cuda::emulated {

template <typename T>
struct EmulatedArg {
  using type = T;
};

// Runs kernel(args...) over the grid, block after block, on one std::thread per CUDA thread of a
// block (the same threads serve every block, so launches of many blocks stay cheap).
template <typename... Params>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                   cudaStream_t /*stream*/, typename EmulatedArg<Params>::type... args) {
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024) return cudaErrorInvalidConfiguration;
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  gridDim = grid;
  blockDim = block;
  // Per block, set up by this thread while the workers wait at `phase`: shared memory (NaN, so
  // reading what no thread wrote poisons the result), the block barrier and the warps.
  std::vector<float> shared;
  std::unique_ptr<std::barrier<>> block_barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  std::barrier<> phase(static_cast<std::ptrdiff_t>(threads) + 1);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      threadIdx = uint3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
      for (unsigned long long b = 0; b < blocks; ++b) {
        phase.arrive_and_wait();  // block b is set up
        blockIdx =
            uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                  static_cast<unsigned>(b / (1ull * grid.x * grid.y))};
        context = ThreadContext{block_barrier.get(), warps[i / 32].get(), static_cast<int>(i % 32),
                                shared.data()};
        kernel(args...);
        // A thread that has exited no longer holds up the others' barriers, as on a GPU.
        context.block->arrive_and_drop();
        context.warp->barrier.arrive_and_drop();
        phase.arrive_and_wait();  // block b is done
      }
    });
  }
  for (unsigned long long b = 0; b < blocks; ++b) {
    shared.assign(shared_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
    block_barrier = std::make_unique<std::barrier<>>(threads);
    warps.clear();
    for (unsigned first = 0; first < threads; first += 32) {
      warps.push_back(std::make_unique<Warp>(std::min(32u, threads - first)));
    }
    phase.arrive_and_wait();
    phase.arrive_and_wait();
  }
  for (std::thread& thread : pool) thread.join();
  return cudaSuccess;
}

inline cudaError_t MemsetAsync(void* data, int value, std::size_t bytes, cudaStream_t) {
  std::memset(data, value, bytes);
  return cudaSuccess;
}

template <typename... Params>
cudaError_t AllowDynamicShared(void (*)(Params...), int) {
  return cudaSuccess;
}

inline float* DynamicShared() { return context.shared; }

}  // namespace autopar::kernels::cuda::emulated
