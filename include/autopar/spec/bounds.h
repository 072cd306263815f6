// The input bounds (docs/models.md §1, docs/cli.md §2): sizes beyond them describe no model or
// cluster anyone trains, and the products the models form from them (tokens × hidden × layers,
// bytes per GPU, GPUs) must stay far inside 64-bit integers and finite doubles. Every reader of
// user input checks them where the value is read, naming the field or flag and the bound.
#pragma once

#include <cstdint>

namespace autopar::bounds {

inline constexpr int64_t kMaxLayers = 100'000;
inline constexpr int64_t kMaxWidth = 1'000'000;  // hidden, heads, head dims
inline constexpr int64_t kMaxFfn = 10'000'000;   // an MLP's (or expert's) hidden size
inline constexpr int64_t kMaxVocabulary = 100'000'000;
inline constexpr int64_t kMaxSequence = int64_t{1} << 24;  // tokens per sequence, positions
inline constexpr int64_t kMaxExperts = int64_t{1} << 16;
inline constexpr int64_t kMaxGpus = int64_t{1} << 24;   // nodes × GPUs per node, any parallel size
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;  // sequences per step, per micro-batch
inline constexpr int64_t kMaxTokensPerStep = int64_t{1} << 40;
// A model, GPU or cluster document (YAML or config.json), or a pasted launch script: real ones
// are a few KiB; a larger one is refused before it is parsed (parsing is not linear in yaml-cpp).
inline constexpr int64_t kMaxDocumentBytes = int64_t{1} << 20;
// A replay table: a row per configuration (~100 bytes), a space of a few hundred thousand.
inline constexpr int64_t kMaxReplayTableBytes = int64_t{64} << 20;

}  // namespace autopar::bounds
