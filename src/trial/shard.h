// What one rank holds of a configuration: its coordinates and process groups, the shapes of its
// shards, and its parameters with their gradients and optimizer states.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autopar/backend/backend.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"
#include "src/trial/comm.h"

namespace autopar::trial {

using backend::Buffer;
using backend::Device;
using backend::StatusOr;

// Megatron-core rank order, tp fastest: rank = tp + TP·(up + UP·(cp + CP·(dp + DP·pp))).
struct Coordinates {
  int tp = 0, up = 0, cp = 0, dp = 0, pp = 0;
  static Coordinates Of(int rank, const ParallelConfig& c);
};

// The groups a dense trial communicates on, built once per trial with MPI_Comm_split.
struct ProcessGroups {
  Coordinates at;
  Comm tp, pp, dp, embedding;  // embedding: first and last pipeline stage (tied weights)
  static StatusOr<ProcessGroups> Create(backend::Backend& backend, const backend::Group& world,
                                        const ParallelConfig& c, Deadline deadline);
};

// Per-rank shapes (elements). T: tokens of a micro-batch; Tl: the rows this rank holds outside
// the tensor-parallel region (T / tp with sequence parallelism).
struct Shapes {
  int64_t tp, pp, vpp, mbs, seq, tokens, local_tokens, hidden;
  int64_t heads, kv_heads, head_dim, q_cols, kv_cols, qkv_cols;
  int64_t ffn, fc1_cols, vocab, vocab_shard, vocab_start, max_positions;
  int64_t layers_per_chunk;
  bool sp, swiglu, rmsnorm, rope, learned_positions, tied;
  static Shapes Of(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c, int tp_rank);
};

// Empty when the trial runner can express `c` for `m`, else why not.
std::string Unsupported(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c);

// One transformer layer's weights (compute dtype, PyTorch [out, in] layout) and f32 gradients.
struct LayerWeights {
  Tensor norm1, norm1_bias, qkv, proj, norm2, norm2_bias, fc1, fc2;
  Tensor d_norm1, d_norm1_bias, d_qkv, d_proj, d_norm2, d_norm2_bias, d_fc1, d_fc2;
};

struct ChunkWeights {
  std::vector<LayerWeights> layers;
  int first_layer = 0;  // global index of layers[0]
};

// How a contiguous piece of a parameter is initialised and identified: element (r, c) of the
// piece is element (row_offset + r, col_offset + c) of a global [*, global_cols] matrix.
struct Piece {
  int64_t offset = 0, numel = 0;
  uint64_t seed = 0;
  enum Init : uint8_t { kHash, kOnes, kZeros } init = kHash;
  int64_t rows = 0, cols = 0, global_cols = 0, row_offset = 0, col_offset = 0;
  bool tp_replicated = false;  // same on every tp rank (norms, positions): SP sums its grads
  bool duplicate = false;      // a copy another rank owns too (the tied output embedding)
};

class ModelShard {
 public:
  // Lays out and allocates this rank's parameters, gradients and optimizer states, and
  // initialises them from `seed`. kOom when they do not fit.
  static StatusOr<ModelShard> Create(Device& device, const ModelSpec& m, const Shapes& s,
                                     const ParallelConfig& c, const Coordinates& at,
                                     uint64_t seed);

  std::vector<ChunkWeights> chunks;  // one per model chunk (vpp)
  Tensor word_embedding, d_word_embedding;   // first stage
  Tensor positions, d_positions;             // first stage, learned positions
  Tensor final_norm, final_norm_bias, d_final_norm, d_final_norm_bias;  // last stage
  Tensor output, d_output;                   // last stage (the embedding itself when tied)

  Status ZeroGrads(Device& device);
  // Gradient sync and Adam: TP sum of replicated grads under SP, tied embedding grads over the
  // embedding group, DP all-reduce or reduce-scatter + all-gather (distributed optimizer).
  Status Step(Device& device, ProcessGroups& g, const ParallelConfig& c, float lr, float eps,
              int64_t step);
  // Sharding-invariant checksums of the weights, summed over `g`'s world by the caller.
  StatusOr<std::pair<double, double>> Fingerprint(Device& device, const Coordinates& at,
                                                  uint64_t seed);

 private:
  std::vector<Piece> pieces_;
  int64_t padded_numel_ = 0;
  Buffer weights_, grads_, master_, exp_avg_, exp_avg_sq_;
  bool separate_master_ = false;
  bool tied_ = false;
};

}  // namespace autopar::trial
