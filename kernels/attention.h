// Host reference scaled-dot-product attention: the naive O(seq_q * seq_kv) algorithm in double,
// the oracle for the blockwise CPU kernel and for future CUDA kernels.
//
// Layouts (autopar/device/ops.h, AttentionDesc): q, dq [seq_q, batch, heads_q, head_dim] with
// q_stride elements between (s, b) rows; k, v, dk, dv [seq_kv, batch, heads_kv, head_dim] with
// kv_stride; out, dout packed like q; lse [seq_q, batch, heads_q]. Query head h uses key/value head
// h / (heads_q / heads_kv). With `causal`, key j is visible to query i iff
// kv_offset + j <= q_offset + i; a query with no visible key gets out = 0, lse = -inf.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t head_dim = 0;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  bool causal = true;
  std::int64_t q_offset = 0;
  std::int64_t kv_offset = 0;
  double scale = 0.0;          // 0: 1 / sqrt(head_dim)
  std::int64_t q_stride = 0;   // 0: heads_q * head_dim
  std::int64_t kv_stride = 0;  // 0: heads_kv * head_dim

  double resolved_scale() const;
  std::int64_t resolved_q_stride() const { return q_stride ? q_stride : heads_q * head_dim; }
  std::int64_t resolved_kv_stride() const { return kv_stride ? kv_stride : heads_kv * head_dim; }
  bool visible(std::int64_t i, std::int64_t j) const {
    return !causal || kv_offset + j <= q_offset + i;
  }
};

template <typename T>
void AttentionForward(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out,
                      T* lse);

// Gradients given the final out and lse of the queries; dq, dk, dv are overwritten (only the
// head slots of a strided layout are touched).
template <typename T>
void AttentionBackward(const AttentionShape& shape, const T* q, const T* k, const T* v,
                       const T* out, const T* dout, const T* lse, T* dq, T* dk, T* dv);

// Folds a partial result (part_out, part_lse) into (out, lse): rows of head_dim values.
template <typename T>
void AttentionMerge(std::int64_t rows, std::int64_t head_dim, T* out, T* lse, const T* part_out,
                    const T* part_lse);

}  // namespace autopar::kernels::ref
