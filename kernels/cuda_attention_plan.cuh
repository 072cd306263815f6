// Tile sizes and shared-memory layout of the flash-style attention kernels (attention_*.cu).
//
// Pure C++ (no CUDA headers) so the host can plan, check a plan against the device's shared
// memory before launching, and unit-test it. Every tile lives in shared memory as float whatever
// the storage type, with rows of q/k/v/dout padded to an odd stride so that 32 lanes reading
// column d of 32 different rows hit 32 different banks. The kernels carve their shared memory
// with the offsets below, so the byte counts checked on the host are the ones used.
#pragma once

#include <cstddef>
#include <cstdint>

namespace autopar::kernels::cuda {

// Threads per attention block; the kernels' __launch_bounds__ use it too.
inline constexpr int kAttentionThreads = 128;

struct AttentionTilePlan {
  int block_q = 0;   // query rows per tile
  int block_kv = 0;  // key rows per tile (<= 32: one lane per key in the softmax)
  int threads = 0;   // threads per block
  int head_dim = 0;
  int row_stride = 0;  // floats between rows of a q/k/v/dout tile

  // Floats of one padded [rows, head_dim] tile and of a packed one.
  constexpr int Tile(int rows) const { return rows * row_stride; }
  constexpr int Packed(int rows) const { return rows * head_dim; }

  // Forward: q, k, v tiles; o accumulator; scores; row max, row sum, rescale factor.
  constexpr std::size_t ForwardFloats() const {
    return static_cast<std::size_t>(Tile(block_q) + 2 * Tile(block_kv) + Packed(block_q) +
                                    block_q * block_kv + 3 * block_q);
  }
  // Backward over one key tile: k, v, q, dout tiles; dk, dv accumulators; P and dS; lse, delta.
  constexpr std::size_t BackwardKvFloats() const {
    return static_cast<std::size_t>(2 * Tile(block_kv) + 2 * Tile(block_q) + 2 * Packed(block_kv) +
                                    2 * block_q * block_kv + 2 * block_q);
  }
  // Backward over one query tile: q, dout, k, v tiles; dq accumulator; dS; lse, delta.
  constexpr std::size_t BackwardQFloats() const {
    return static_cast<std::size_t>(2 * Tile(block_q) + 2 * Tile(block_kv) + Packed(block_q) +
                                    block_q * block_kv + 2 * block_q);
  }
  constexpr std::size_t MaxBytes() const {
    std::size_t floats = ForwardFloats();
    if (BackwardKvFloats() > floats) floats = BackwardKvFloats();
    if (BackwardQFloats() > floats) floats = BackwardQFloats();
    return floats * sizeof(float);
  }
};

// Smaller tiles for wider heads keep the backward's shared memory near 100 KiB: head_dim 128 at
// 32x32 and head_dim 256 at 16x16 both fit an A100 (163 KiB) and an H100 (227 KiB).
constexpr AttentionTilePlan PlanAttentionTiles(std::int64_t head_dim) {
  AttentionTilePlan plan;
  plan.head_dim = static_cast<int>(head_dim);
  plan.block_q = plan.block_kv = head_dim <= 128 ? 32 : head_dim <= 256 ? 16 : 8;
  plan.threads = kAttentionThreads;
  plan.row_stride = static_cast<int>(head_dim % 2 == 0 ? head_dim + 1 : head_dim);
  return plan;
}

}  // namespace autopar::kernels::cuda
