// Host reference softmax cross-entropy over one vocabulary shard, in the per-row pieces that
// Megatron's vocab-parallel cross-entropy combines across tensor-parallel ranks (see
// autopar/device/ops.h, CrossEntropyDesc): max, then sum-exp and target logit, then the loss.
//
// logits [rows, vocab] hold global columns [vocab_start, vocab_start + vocab); targets are global
// ids. Combining shards: row_max = max over shards, partials = sum over shards (computed with the
// combined row_max). With one shard holding the whole vocabulary the pieces are the plain loss.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

template <typename T>
void CrossEntropyMax(const T* logits, std::int64_t rows, std::int64_t vocab, T* row_max);

// partials[r] = sum_j exp(logit_rj - row_max[r]); partials[rows + r] = target logit or 0.
template <typename T>
void CrossEntropyPartials(const T* logits, const std::int32_t* targets, std::int64_t rows,
                          std::int64_t vocab, std::int64_t vocab_start, const T* row_max,
                          T* partials);

// loss[r] = row_max[r] + log(partials[r]) - partials[rows + r].
template <typename T>
void CrossEntropyLoss(const T* row_max, const T* partials, std::int64_t rows, T* loss);

// dlogits = dloss[r] * (softmax - onehot(target)); dlogits may alias logits.
template <typename T>
void CrossEntropyBackward(const T* logits, const std::int32_t* targets, const T* row_max,
                          const T* partials, const T* dloss, std::int64_t rows, std::int64_t vocab,
                          std::int64_t vocab_start, T* dlogits);

}  // namespace autopar::kernels::ref
