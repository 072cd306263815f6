// CostModel: the analytic memory and time model of docs/models.md §3–§4 for one (model, train, cluster).
//
// Evaluate(config) is allocation-free arithmetic so a planner can rank millions of candidates.
// The step time is exposed as t(c) = θ₀ + Σ_k θ_k·x_k(c): `features` holds x_k, the component
// times under nominal efficiencies, already multiplied by their schedule factors, so that with
// θ = 1 the step time is their sum. The posterior of the online tuner learns θ.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "autopar/perf/constants.h"
#include "autopar/perf/params.h"
#include "autopar/space/config.h"
#include "autopar/space/space.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar {

enum Feature : int {
  kGemm,         // linear layers, logits
  kAttention,    // attention core (QKᵀ, softmax·V) forward and backward
  kMemoryBound,  // norms, activations, residuals, RoPE, softmax / cross-entropy
  kTpComm,       // tensor-parallel all-reduce, or all-gather + reduce-scatter with SP
  kCpComm,       // context-parallel ring exchange, the part not hidden behind attention
  kUlyssesComm,  // Ulysses all-to-alls
  kEpComm,       // expert-parallel dispatch / combine all-to-alls
  kPpComm,       // pipeline send / recv
  kDpComm,       // data-parallel gradient reduction and parameter gather, exposed part
  kOptimizer,    // the Adam step
  kNumFeatures
};
const char* FeatureName(int k);

struct MemoryBreakdown {  // bytes on the most loaded rank
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double logits = 0;
  double overhead = 0;
  double total() const { return weights + gradients + optimizer + activations + logits + overhead; }
};

struct TimeBreakdown {
  std::array<double, kNumFeatures> features{};  // x_k(c), seconds
  double step_time_s = 0;                       // Σ x_k (θ = 1)
  double forward_per_microbatch_s = 0;          // one micro-batch through one pipeline stage
  double backward_per_microbatch_s = 0;         // its backward (with recompute)
  double layer_forward_s = 0;                   // one transformer layer, one micro-batch
  double layer_backward_s = 0;
  double bubble_fraction = 0;                   // idle share of the pipeline schedule
  int64_t microbatches = 0;
  // Data-parallel communication before any hiding (features[kDpComm] is what shows), and the
  // buckets the model overlaps it in on the first pipeline stage: 0 when the knob is off (one
  // reduction after the flush, one gather after the optimizer step).
  double dp_comm_s = 0;
  int64_t grad_reduce_buckets = 0;
  int64_t param_gather_buckets = 0;
};

struct Estimate {
  TimeBreakdown time;
  MemoryBreakdown memory;
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;
  double mfu = 0;
  double peak_memory_gib = 0;
  bool fits = false;
};

// Micro-batches whose activations pipeline stage `stage` of `c` holds at its peak, in whole
// stages' worth: Megatron-LM's 1F1B keeps min(m, pp − stage); its interleaved schedule warms up
// with 2·(pp − stage − 1) + (vpp − 1)·pp chunk forwards (all m·vpp where m = pp) and holds one
// more, each a vpp-th of the stage (pp + (pp − 1)/vpp on the first stage, Korthikanti et al.'s
// factor; pp − (pp − 1)/vpp on the last).
double MicrobatchesInFlight(const ParallelConfig& c, int64_t microbatches, int64_t stage);

struct LayerBytes;
struct LayerCost;
struct LayerShape;
struct StageLayout;
struct StageSummary;
struct StageTimeParts;

class CostModel {
 public:
  CostModel(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster,
            const PerfConstants& constants);

  // The full estimate. `c` must be complete (dp set) and valid for the space.
  Estimate Evaluate(const ParallelConfig& c) const;
  MemoryBreakdown Memory(const ParallelConfig& c) const;
  TimeBreakdown Time(const ParallelConfig& c) const;

  // One pipeline stage of `c`: its transformer layers, one micro-batch's forward and backward
  // through it (s, with recompute, and the logits on the last stage) and its memory (GiB).
  struct StageEstimate {
    int64_t layers = 0;
    double time_s = 0;
    double memory_gib = 0;
  };
  std::vector<StageEstimate> Stages(const ParallelConfig& c) const;

  // Chooses c's uneven split (pp_first, pp_last), and with `choose_recompute_layers` under full
  // recompute the block-recompute depth (recompute_layers), among every choice Megatron-LM can
  // express for c's pp and vpp: the one whose slowest stage is fastest with every stage within
  // the GPU's memory, or the least peak memory when no choice fits (docs/models.md §4.6). The
  // result is canonical (CanonicalStages). False, `c` unchanged, when no split is valid.
  bool BalanceStages(ParallelConfig& c, bool choose_recompute_layers) const;

  const ParamCounts& params() const { return params_; }
  double model_flops_per_step() const { return model_flops_per_step_; }
  const PerfConstants& constants() const { return constants_; }

  // Time of a collective on a group of `n` ranks laid out with `stride` between members
  // (Megatron rank order), moving `bytes` per rank. Exposed for the probe and tests.
  double AllReduceTime(double bytes, int64_t n, int64_t stride) const;
  double AllGatherTime(double bytes_total, int64_t n, int64_t stride) const;  // also RS
  double AllToAllTime(double bytes, int64_t n, int64_t stride) const;
  double P2PTime(double bytes, bool crosses_nodes) const;
  // Whether some group of this shape leaves its NVLink domain (a node unless the GPU's system is
  // larger, ClusterSpec::NvlinkDomainGpus) and so runs on the network.
  bool CrossesNodes(int64_t n, int64_t stride) const;
  // Compute at nominal efficiency: a GEMM whose sharded dimension is `sharded_dim`, the attention
  // core (flash-style), and memory-bound kernels moving `bytes`. Exposed for the probe.
  double GemmTime(double flops, double sharded_dim) const;
  // A GEMM run at `peak` FLOP/s (the output layer's BF16 one in FP8 training).
  double GemmTimeAt(double flops, double sharded_dim, double peak) const;
  double AttentionTime(double flops) const;
  double MemoryBoundTime(double bytes) const;
  // The routed experts' grouped GEMM, each local expert seeing `rows` rows (docs/models.md §4.2).
  double ExpertGemmTime(double flops, double sharded_dim, double rows) const;

 private:
  double BusBandwidth(int64_t n, int64_t stride) const;
  int64_t MembersPerDomain(int64_t n, int64_t stride) const;
  double Latency(int64_t n, int64_t stride) const;
  // The cost of one layer of each kind and the last stage's own work (time_model.cc), and one
  // stage's time and memory from its layers (StageLayout, src/perf/stages.h).
  StageTimeParts TimeParts(const ParallelConfig& c) const;
  // One layer's forward and backward (LayerTime), from the configuration's shapes (ShapeOf):
  // its compute (returns the unfused attention's softmax time, which selective recompute
  // repeats, and the forward GEMM times of the column-parallel linears, QKV and a dense layer's
  // fc1, under whose backward GEMMs Megatron runs their collectives) and its collectives
  // (returns what the backward exposes of them where it differs from the forward: the ring's
  // and tensor parallel's), time_model.cc.
  struct ComputeParts {
    double softmax = 0;
    double qkv_gemm = 0;
    double fc1_gemm = 0;  // 0 in a MoE layer
    // The forward of what selective recompute's modules rerun (docs/models.md §4.3): the two
    // norms' passes; the MLP block (a dense MLP, or a MoE layer whole) in GEMMs, elementwise
    // passes and collectives; its parts the routed experts' activation and the shared experts.
    double norms = 0;
    double mlp_gemm = 0, mlp_memory = 0, mlp_tp = 0, mlp_ep = 0;
    double moe_act = 0, shared_gemm = 0, shared_memory = 0;
  };
  struct BackwardComm {
    double cp = 0;
    double tp = 0;
    // Memory-bound passes of the backward beyond twice the forward's (the all-gather context
    // parallelism's gradient buffers).
    double memory_bound = 0;
  };
  LayerShape ShapeOf(const ParallelConfig& c) const;
  LayerCost LayerTime(const ParallelConfig& c, const LayerShape& x, bool moe, bool windowed) const;
  ComputeParts LayerCompute(const ParallelConfig& c, const LayerShape& x, bool moe, bool windowed,
                            std::array<double, kNumFeatures>& f) const;
  BackwardComm LayerCommunication(const ParallelConfig& c, const LayerShape& x, bool moe,
                                  ComputeParts& parts, std::array<double, kNumFeatures>& f) const;
  // LayerCommunication's Ulysses all-to-alls and context-parallel ring or gathers.
  void SequenceSplitCommunication(const ParallelConfig& c, const LayerShape& x,
                                  std::array<double, kNumFeatures>& f,
                                  BackwardComm& backward) const;
  // What selective recompute's modules rerun in a layer's backward `b`, from its forward `f`.
  void AddSelectiveRerun(const ParallelConfig& c, bool moe, const ComputeParts& parts,
                         const std::array<double, kNumFeatures>& f,
                         std::array<double, kNumFeatures>& b) const;
  // The stages of c (the slowest, and the one with the longest gradient reduction), the
  // reduction's time for given parameters per rank, and the DP and optimizer features.
  StageSummary SummarizeStages(const ParallelConfig& c, const StageTimeParts& parts) const;
  // An attention core's backward time over its forward time (flash 2.5, unfused 2; dropout).
  double AttentionBackwardRatio() const;
  double GradReduceTime(const ParallelConfig& c, double dense, double experts) const;
  void AddDataParallel(const ParallelConfig& c, const StageSummary& st, TimeBreakdown& out) const;
  LayerCost StageTime(const StageTimeParts& parts, const ParallelConfig& c,
                      const StageLayout& layout, int64_t stage) const;
  // A stage's memory from its layers; `x` is LayerBytesOf(c), which depends on c but not on its
  // split or recompute depth, so callers trying several splits compute it once.
  MemoryBreakdown StageMemory(const ParallelConfig& c, const LayerBytes& x,
                              const StageLayout& layout, int64_t stage) const;
  // The pieces of a stage's memory (cost_model.cc): one layer's activation bytes, the sequence-
  // split attention's workspaces, and the stage's weights, gradients and optimizer state.
  LayerBytes LayerBytesOf(const ParallelConfig& c) const;
  double ContextWorkspaceBytes(const ParallelConfig& c, double tokens, double d, double tp_heads,
                               double tp_kv) const;
  // Whether the first or the last stage of c, given the fewest layers Megatron allows (vpp),
  // needs more than `cap_bytes`: then no split of c fits (balance.cc).
  bool ThinEndStageOverflows(ParallelConfig c, double cap_bytes) const;
  void StageParameterBytes(const ParallelConfig& c, const StageLayout& layout, int64_t stage,
                           MemoryBreakdown& mem) const;

  ModelSpec model_;
  TrainSpec train_;
  ClusterSpec cluster_;
  PerfConstants constants_;
  ParamCounts params_;
  double peak_flops_ = 0;  // the training precision's (MFU's denominator)
  // The transformer layers' GEMMs: the training precision's peak, times Fp8Traits::gemm_ratio
  // in FP8 training.
  double gemm_peak_flops_ = 0;
  // Attention's and the output layer's: BF16 when training in FP8 (neither is a TE linear layer).
  double attention_peak_flops_ = 0;
  AttentionShapeLaw attention_law_;    // of the GPU (AttentionShapeLawOf)
  bool fp8_ = false;                   // FP8 training (Transformer Engine, docs/models.md §4.2)
  bool fp8_transposed_copy_ = false;   // Fp8Traits::transposed_copy of the GPU
  double grouped_gemm_tile_rows_ = 0;  // GroupedGemmTileRows of the GPU
  // Bytes of a weight or activation element: 2 under mixed precision, 4 in fp32 training.
  double element_bytes_ = 2;
  double model_flops_per_step_ = 0;
};

// The cost model's balancer as the search space's splitter.
class StageBalancer : public StageSplitter {
 public:
  explicit StageBalancer(const CostModel& model) : model_(model) {}
  bool Split(ParallelConfig& c, bool choose_recompute_layers) const override {
    return model_.BalanceStages(c, choose_recompute_layers);
  }

 private:
  const CostModel& model_;
};

}  // namespace autopar
