// Host reference rotary position embedding (Su et al. 2021), rotate-half form as Megatron-core.
//
// x, y [seq, batch, heads, head_dim] with `row_stride` elements between (s, b) rows. Pairs
// (i, i + rotary_dim / 2) of the first rotary_dim features rotate by angle
// (position_offset + s) * base^(-2i / rotary_dim); angles are computed in double. Backward is the
// inverse rotation. y may alias x.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

struct RopeShape {
  std::int64_t seq = 0;
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;  // even, <= head_dim
  std::int64_t position_offset = 0;
  std::int64_t row_stride = 0;  // >= heads * head_dim
  double base = 10000.0;
};

template <typename T>
void RopeForward(const RopeShape& shape, const T* x, T* y);
template <typename T>
void RopeBackward(const RopeShape& shape, const T* dy, T* dx);

}  // namespace autopar::kernels::ref
