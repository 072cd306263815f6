// A rank's place in a configuration (groups.cc): its coordinates and process groups, the shapes of
// what it holds, and what the trial runner can express. What it holds is shard.h's.
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
#include "src/trial/linear.h"

namespace autopar::trial {

using device::StatusOr;

// Megatron-core rank order with Ulysses next to tp: rank = tp + TP·(up + UP·(cp + CP·(dp +
// DP·pp))). The experts' grid (MoE parallel folding, docs/architecture.md §3: etp·ep | tp·cp·dp)
// orders the tp·cp·dp ranks of one up slice and stage by q = tp + TP·k, k = cp + CP·dp: etp
// consecutive values of q form an expert-tensor group, ep such groups an expert-parallel one
// (etp-ep-edp). At etp = tp the ep consecutive values of k form an expert-parallel group.
struct Coordinates {
  int tp = 0, up = 0, cp = 0, dp = 0, pp = 0;
  int etp = 0;  // rank in the expert-tensor group: q mod etp
  int ep = 0;   // rank in the expert-parallel group: (q / etp) mod ep
  // Rank among the ranks holding the same experts (the expert-data-parallel group), up fastest:
  // up + UP·(q / (etp·ep)).
  int edp = 0;
  static Coordinates Of(int rank, const ParallelConfig& c);
};

// Which process groups a configuration communicates on: a group is used when it spans more than
// one rank and the model has the work it carries (expert groups and the sample group `seq` only
// for mixture-of-experts models, the embedding group only for tied embeddings over pp > 1).
struct GroupUse {
  bool tp = false, up = false, cp = false, pp = false, dp = false;
  bool ep = false, edp = false, seq = false, embedding = false;
  bool etp = false;  // an expert-tensor group of its own: etp > 1 and etp ≠ tp
  friend bool operator==(const GroupUse&, const GroupUse&) = default;
};
GroupUse UsedGroups(const ParallelConfig& c, bool moe, bool tied_embedding);

// The groups a trial communicates on, built per trial with MPI_Comm_split and connected with
// Platform::ConnectSplit (so a CUDA platform reuses the communicators of earlier trials over the
// same ranks). Groups not in `use` are neither split nor connected; a group of one rank is left
// unconnected (callers skip its collectives).
struct ProcessGroups {
  Coordinates at;
  Comm tp, up, cp, pp;
  // dp: every rank holding the same dense weights (same tp and pp: up·cp·dp ranks), over which
  // dense gradients are reduced and the distributed optimizer shards. edp: the ranks holding the
  // same experts (same etp rank, ep rank and pp: tp·up·cp·dp / (etp·ep) ranks). ep: the
  // expert-parallel group. etp: the expert-tensor group, connected only where it is not the tp
  // group (at etp = tp the experts use tp).
  Comm dp, edp, ep, etp;
  Comm seq;        // the ranks that hold pieces of the same samples (tp·up·cp): MoE statistics
  Comm embedding;  // first and last pipeline stage (tied weights)
  static StatusOr<ProcessGroups> Create(device::Platform& platform, const device::Group& world,
                                        const ParallelConfig& c, Deadline deadline,
                                        const GroupUse& use);
};

// Per-rank shapes (elements). T (`tokens`): the rows of a micro-batch this rank's tensor-parallel
// region holds, mbs·seq/(cp·up); Tl (`local_tokens`): the rows outside it (T / tp with sequence
// parallelism). Rows are (s, b) with s slowest; a rank's s are its share of the sequence (see
// GlobalPosition).
struct Shapes {
  int64_t tp, pp, vpp, mbs, seq, seq_local, tokens, local_tokens, hidden;
  int64_t heads, kv_heads, head_dim, q_cols, kv_cols, qkv_cols;
  int64_t ffn, fc1_cols, vocab, vocab_shard, vocab_start, max_positions;
  // This stage's transformer layers in each model chunk (ChunkLayers: the chunks of one stage hold
  // as many, the stages may differ, docs/trial.md §16, except the first and the last chunk where
  // the embedding or the loss counts in the split), the most of them (what a slot holds), and the
  // global index of each chunk's first layer (ChunkFirstLayer, Megatron-core's chunk-major order).
  std::vector<int64_t> chunk_layers;
  int64_t layers_per_chunk;
  std::vector<int64_t> chunk_first_layer;
  bool sp, swiglu, rmsnorm, rope, learned_positions, tied;
  // Megatron-core's --qk-layernorm: the norm (rmsnorm's kind) over head_dim of each query and key
  // head after the QKV projection, before RoPE.
  bool qk_norm;
  // Context parallelism splits the sequence in 2·cp chunks of `chunk` positions; Ulysses gives
  // each up rank heads/up query heads (`ul_heads`) and the kv heads they read (`ul_kv_heads`,
  // replicated when kv_heads < up) for the cp rank's rows.
  int64_t cp, up, chunk, ul_heads, ul_kv_heads, ul_cols;
  // The ring's K and V all-gathered instead of passed around (ParallelConfig::cp_allgather).
  bool cp_allgather;
  // Mixture of experts: experts and the ep rank's share, routed top-k, the expert tensor
  // parallel size and its shard of one expert's width, the tp shard of the shared experts'
  // width, and the leading dense layers.
  int64_t experts, local_experts, topk, etp, expert_ffn, shared_ffn, first_dense;
  // Megatron's flex dispatcher (ParallelConfig::flex_dispatcher): a row per (token, ep rank
  // holding its experts) rather than per (token, expert); moe.h.
  bool flex;
  // The transformer layers' linear GEMMs (qkv, proj, fc1, fc2, a MoE layer's shared experts) in
  // fp8 with --fp8-format, as TransformerEngine's layers; the output layer and the router stay in
  // the compute dtype, as in Megatron. Routed experts stay too: their token counts vary per step
  // and cuBLASLt's fp8 needs multiples of 16 (Megatron pads them, --moe-router-padding-for-fp8).
  Fp8Formats fp8;
  // What selective recompute reruns (ParallelConfig::selective_modules; 0 without it).
  uint8_t rerun;
  bool Reruns(RecomputeModule m) const { return (rerun & m) != 0; }
  // Whether a layer's dense MLP part (its MLP, or a MoE layer's shared experts) is rebuilt in
  // backward: mlp in a dense layer; moe or shared_experts in a MoE layer.
  bool RerunsMlpPart(bool moe) const {
    return moe ? Reruns(kRecomputeMoe) || Reruns(kRecomputeSharedExperts) : Reruns(kRecomputeMlp);
  }
  bool IsMoe(int64_t layer) const { return experts > 0 && layer >= first_dense; }
  // Global index of layer `layer_in_chunk` of this stage's model chunk `model_chunk`.
  int64_t GlobalLayer(int model_chunk, int64_t layer_in_chunk) const {
    return chunk_first_layer[model_chunk] + layer_in_chunk;
  }
  // Width of the dense MLP part of a layer: the MLP, or the shared experts of a MoE layer.
  int64_t MlpFfn(bool moe) const { return moe ? shared_ffn : ffn; }
  int64_t MlpFc1Cols(bool moe) const { return (swiglu ? 2 : 1) * MlpFfn(moe); }
  // The shapes of the rank at `at` (its tp rank's vocabulary shard, its pipeline stage's layers).
  // The stage split must be valid (StageSplitError).
  static Shapes Of(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c,
                   const Coordinates& at);
};

// The global sequence position of this rank's local position `s`: the cp rank holds chunks cp_rank
// and 2·cp − 1 − cp_rank (load-balanced causal attention), and up rank u the u-th slice of them.
int64_t GlobalPosition(const Shapes& s, const Coordinates& at, int64_t s_local);

// Empty when a device that has fp8 GEMMs or not (`device_has_fp8`, named `device_name`) can run
// a trial that asks for fp8 or not (`fp8`: --fp8-format); else the reason, naming the flag and
// where fp8 trials run.
std::string Fp8Unsupported(bool fp8, bool device_has_fp8, std::string_view device_name);

// Empty when the trial runner can express `c` for `m`, else why not.
std::string Unsupported(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c);

}  // namespace autopar::trial
