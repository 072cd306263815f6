// Device helpers shared by the attention kernels (attention_forward.cu, attention_backward.cu):
// the causal mask from global positions, the tile ranges it leaves, and tile loads.
//
// Layouts (kernels/attention.h): row (s, b) of q starts at (s * batch + b) * q_stride, of k and v
// at (s * batch + b) * kv_stride, of out and dout at (s * batch + b) * heads_q * head_dim; head h
// adds h * head_dim. lse is [seq_q, batch, heads_q]. Query head h reads key/value head
// h / (heads_q / heads_kv).
#pragma once

#include "kernels/cuda_attention_plan.cuh"
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {

// Key j of the chunk is visible to query i of the chunk; out-of-range rows see nothing.
__device__ __forceinline__ bool Visible(const AttentionArgs& a, std::int64_t i, std::int64_t j) {
  return i < a.seq_q && j < a.seq_kv && (!a.causal || a.kv_offset + j <= a.q_offset + i);
}

// Keys [0, end) can be visible to queries [0, i_end); later keys are masked for all of them.
__device__ __forceinline__ std::int64_t KeyEnd(const AttentionArgs& a, std::int64_t i_end) {
  if (!a.causal) return a.seq_kv;
  const std::int64_t last = a.q_offset + i_end - 1 - a.kv_offset;
  return last + 1 < 0 ? 0 : (last + 1 > a.seq_kv ? a.seq_kv : last + 1);
}

// Queries [start, seq_q) can see some key at or after j0; earlier ones see none of them.
__device__ __forceinline__ std::int64_t QueryStart(const AttentionArgs& a, std::int64_t j0) {
  if (!a.causal) return 0;
  const std::int64_t first = a.kv_offset + j0 - a.q_offset;
  return first < 0 ? 0 : (first > a.seq_q ? a.seq_q : first);
}

// Rows [row0, row0 + rows) of one head of a [seq, batch, heads, head_dim] tensor whose (s, b)
// rows are `stride` apart, into a float tile with `tile_stride` floats per row; rows at or past
// `seq` are zero. Consecutive threads read consecutive features (coalesced).
template <typename T>
__device__ __forceinline__ void LoadTile(float* tile, int tile_stride, const T* base,
                                         std::int64_t seq, std::int64_t batch, std::int64_t b,
                                         std::int64_t stride, std::int64_t head_offset,
                                         std::int64_t row0, int rows, int head_dim) {
  for (int e = static_cast<int>(threadIdx.x); e < rows * head_dim;
       e += static_cast<int>(blockDim.x)) {
    const int r = e / head_dim;
    const int d = e % head_dim;
    const std::int64_t s = row0 + r;
    tile[r * tile_stride + d] =
        s < seq ? ToFloat(base[(s * batch + b) * stride + head_offset + d]) : 0.0f;
  }
}

// Checks `bytes` against the device's opt-in limit and opts the kernel into it when it passes the
// default 48 KiB.
template <typename... Params>
cudaError_t PrepareSharedMemory(void (*kernel)(Params...), std::size_t bytes, int max_bytes) {
  if (bytes > static_cast<std::size_t>(max_bytes)) return cudaErrorInvalidConfiguration;
  if (bytes <= 48 * 1024) return cudaSuccess;
  return AllowDynamicShared(kernel, static_cast<int>(bytes));
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
