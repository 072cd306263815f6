// What one rank holds of a configuration: its parameters with their gradients and optimizer
// states, in shards of groups.h's shapes (the rank's coordinates and process groups are there).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "autopar/device/platform.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"
#include "src/trial/comm.h"
#include "src/trial/grad_buckets.h"
#include "src/trial/groups.h"
#include "src/trial/linear.h"

namespace autopar::trial {

using device::Buffer;
using device::Device;
using device::StatusOr;

// One routed expert's tp shard: fc1 [gate; up] rows of the expert's width, fc2 its columns.
struct ExpertWeights {
  Tensor fc1, fc2, d_fc1, d_fc2;
};

// One transformer layer's weights (compute dtype, PyTorch [out, in] layout) and f32 gradients.
// In a MoE layer fc1 and fc2 are the shared experts (empty without them), `router` [experts, h]
// is replicated, and `experts` are the ep rank's local experts.
struct LayerWeights {
  Tensor norm1, norm1_bias, qkv, proj, norm2, norm2_bias, fc1, fc2;
  Tensor d_norm1, d_norm1_bias, d_qkv, d_proj, d_norm2, d_norm2_bias, d_fc1, d_fc2;
  // qk-layernorm's [head_dim] weights (empty without it): replicated over tp, their gradients
  // partial sums over tp (each tp rank normalizes its own heads).
  Tensor q_norm, q_norm_bias, k_norm, k_norm_bias;
  Tensor d_q_norm, d_q_norm_bias, d_k_norm, d_k_norm_bias;
  bool moe = false;
  Tensor router, d_router;
  std::vector<ExpertWeights> experts;
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
  bool tp_replicated = false;  // same on every tp rank (norms, positions, router)
  bool tp_partial = false;     // its gradient is a partial sum over tp whatever SP (the router)
  bool duplicate = false;      // a copy another rank owns too (the tied output embedding)
  bool tied = false;           // the tied embedding, summed over the embedding group when pp > 1
  bool continues = false;      // the rest of the parameter the piece before starts (k, v; up)
  int unit = 0;                // what completes its gradient (ModelShard::LayerUnit, ...)
};

class ModelShard {
 public:
  // Lays out and allocates this rank's parameters (in Megatron's order: embedding, layers, final
  // norm, output layer), gradients and optimizer states, and initialises them from `seed`. The
  // data-parallel buckets (grad_buckets.h) follow c.overlap_grad_reduce and `ddp_bucket_size`
  // (0: MegatronDdpBucketSize(dp)). kOom when they do not fit.
  static StatusOr<ModelShard> Create(Device& device, const ModelSpec& m, const Shapes& s,
                                     const ParallelConfig& c, const Coordinates& at, uint64_t seed,
                                     int64_t ddp_bucket_size = 0);

  std::vector<ChunkWeights> chunks;         // one per model chunk (vpp)
  Tensor word_embedding, d_word_embedding;  // first stage
  Tensor positions, d_positions;            // first stage, learned positions
  Tensor final_norm, final_norm_bias, d_final_norm, d_final_norm_bias;  // last stage
  Tensor output, d_output;  // last stage (the embedding itself when tied)

  // Zeroes the gradients for a step of `microbatches` micro-batches whose program calls
  // GradsReady and AwaitParams: the overlap the knobs ask for.
  Status BeginStep(Device& device, int microbatches);

  // The units of the data-parallel overlap: what one call of the step program completes.
  int LayerUnit(int chunk, int64_t layer_in_chunk) const {
    return static_cast<int>(chunk * layers_per_chunk_ + layer_in_chunk);
  }
  int EmbeddingUnit() const { return units_ - 2; }
  int HeadUnit() const { return units_ - 1; }
  // The step program's hooks (no-ops with the knobs off): `unit`'s gradient is complete for one
  // micro-batch (its bucket's reduction starts on the last one, overlap_grad_reduce); `unit` is
  // about to run forward (its bucket's deferred all-gather is waited for, overlap_param_gather).
  Status GradsReady(ProcessGroups& g, int unit);
  Status AwaitParams(ProcessGroups& g, int unit);

  // Gradient sync and Adam: TP sum of replicated grads under SP (and of the router always), tied
  // embedding grads over the embedding group, then per bucket an all-reduce over its
  // data-parallel group, or reduce-scatter + all-gather (distributed optimizer): dense parameters
  // over g.dp, experts over g.edp. Buckets started by GradsReady are waited for; with
  // overlap_param_gather the all-gather is left to the next step's AwaitParams.
  Status Step(Device& device, ProcessGroups& g, float lr, float eps, int64_t step);
  // Sharding-invariant checksums of the weights, summed over `g`'s world by the caller. Completes
  // a deferred all-gather first. The second is the projection on a direction of the whole
  // model's parameters (FingerprintDirection) that no layout changes.
  StatusOr<std::pair<double, double>> Fingerprint(Device& device, ProcessGroups& g,
                                                  uint64_t seed);
  // Moves every copy of every weight by `delta` along that direction
  // (TrialOptions::weight_perturbation; fp32 weights only), before the first step.
  Status Perturb(Device& device, uint64_t seed, double delta);

  // The overlap as it ran in the step since the last BeginStep, over both partitions: buckets
  // whose reduction started under the backward pass, and buckets gathered under the forward.
  int grad_buckets_overlapped() const;
  int param_buckets_overlapped() const;

 private:
  // Dense parameters and routed experts live in separate flat buffers: they are reduced (and
  // sharded by the distributed optimizer) over different groups.
  struct Partition {
    std::vector<Piece> pieces;
    int64_t padded_numel = 0;
    Buffer weights, grads, master, exp_avg, exp_avg_sq;
    GradBuckets sync;            // its buckets and what this rank owns of them
    std::vector<bool> tp_summed;  // per piece: its TP sum is done this step
  };
  static constexpr int kDense = 0, kExperts = 1;
  class Layout;  // where each parameter lies in the partitions (shard.cc)
  // Allocates and initialises both partitions once the layout has sized them, and the state the
  // step's reductions need.
  Status AllocatePartitions(Device& device, const ParallelConfig& c, const Coordinates& at,
                            int64_t ddp_bucket_size);
  Status Allocate(Device& device, Partition& p, int shards, int shard, int64_t bucket_size,
                  bool overlap);
  Status StepPartition(Device& device, Partition& p, Comm& group, const device::AdamParams& adam,
                       const GradBuckets::Prepare& prepare);
  // The reductions of a bucket's gradients that precede the data-parallel one.
  GradBuckets::Prepare PrepareOf(Partition& p, ProcessGroups& g);
  Comm& GroupOf(int part, ProcessGroups& g) { return part == kDense ? g.dp : g.edp; }

  Partition parts_[2];
  bool separate_master_ = false;
  bool sp_ = false;
  bool defer_gather_ = false;
  bool embedding_summed_ = false;  // this step
  // grad_reduce_dtype=bf16 with 16-bit weights: gradients are rounded to bf16 before and after
  // their reduction (RoundToBf16), the precision Megatron's --grad-reduce-in-bf16 reduces in.
  bool round_grads_ = false;
  Device* device_ = nullptr;
  Buffer round_scratch_;
  Status RoundToBf16(Tensor x);
  int64_t layers_per_chunk_ = 1;
  int units_ = 2;
};

}  // namespace autopar::trial
