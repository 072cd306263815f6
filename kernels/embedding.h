// Host reference vocabulary-parallel embedding lookup and its backward.
//
// table [vocab, hidden] holds global ids [vocab_start, vocab_start + vocab); ids outside the shard
// give zero rows, so summing the shards' outputs (an all-reduce) gives the full lookup.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

template <typename T>
void EmbeddingForward(const T* table, const std::int32_t* ids, std::int64_t tokens,
                      std::int64_t hidden, std::int64_t vocab, std::int64_t vocab_start, T* out);

// dtable[id - vocab_start] += dout[t] for the ids in the shard.
template <typename T>
void EmbeddingBackward(const T* dout, const std::int32_t* ids, std::int64_t tokens,
                       std::int64_t hidden, std::int64_t vocab, std::int64_t vocab_start,
                       T* dtable);

}  // namespace autopar::kernels::ref
