// SearchSpace: every ParallelConfig that satisfies the constraints of docs/architecture.md §3 for a model,
// training job and cluster, under the user's restrictions.
//
// Enumeration is a nest of loops over divisors, pruned as early as possible, with no allocation
// per candidate, so the planner can stream millions of candidates through the cost model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autopar/space/config.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar {

// The user's restrictions. An empty list means "every value the constraints allow"; a non-empty
// list restricts (`--tp 1,2,4`) or pins (`--fix sp=on`) the dimension.
//
// The data-parallel overlap knobs and the gradient reduction dtype are not searched: an empty
// list means their default (overlap on, fp32), since overlap never makes Megatron slower in the
// model and a lower-precision reduction changes the numerics, which is the user's call. `--fix`
// pins them; overlap_param_gather=on means on wherever Megatron allows it (dist_opt=on and
// overlap_grad_reduce=on), off elsewhere. FP8 parameters (fp8_param_gather) are not searched
// either (they change the numerics); pinned on, every candidate has them, so every one has the
// distributed optimizer they need.
struct SpaceOptions {
  std::vector<int32_t> tp, pp, dp, cp, up, ep, etp, vpp, mbs, recompute_layers;
  std::vector<bool> sp, dist_opt;
  std::vector<Recompute> recompute;
  std::vector<bool> overlap_grad_reduce, overlap_param_gather;
  std::vector<GradReduceDtype> grad_reduce_dtype;
  std::vector<bool> fp8_param_gather;
  bool tp_across_nodes = false;  // allow tp groups beyond one NVLink domain (a node, or a rack)
  int32_t max_mbs = 16;          // default upper bound on micro-batch sizes
  // Sweep the number of fully-recomputed layers per stage (1 .. layers per stage) instead of
  // recomputing every layer. Multiplies the space; off unless asked for.
  bool sweep_recompute_layers = false;
  // Explore context / Ulysses parallelism when the list is empty and seq_length is at least this.
  int64_t long_sequence_threshold = 16384;
  // What selective recompute reruns in every candidate that has it (Megatron's
  // --recompute-modules; ParallelConfig::recompute_modules's canonical form, 0 = core_attn).
  uint8_t recompute_modules = 0;
  // Megatron's flex token dispatcher (--moe-token-dispatcher-type flex) in every candidate, so
  // only those with etp·ep > 1 (Megatron asserts it; a MoE model's).
  bool flex_dispatcher = false;
  // How the ring's attention crosses the cp group, where cp > 1 and up = 1: false the p2p ring,
  // true the all-gather of K and V (ParallelConfig::cp_allgather). Empty: both are searched.
  std::vector<bool> cp_allgather;
};

// Applies `--fix key=value[,key=value...]` to options (same keys as SPEC). Throws InputError("--fix").
void ApplyFix(const std::string& text, SpaceOptions& options);

// Parses a list flag value such as "1,2,4". Throws InputError(flag).
std::vector<int32_t> ParseIntList(const std::string& flag, const std::string& text);

// Chooses a configuration's uneven pipeline split, and where asked its block-recompute depth:
// the cost model's stage balancer (CostModel::BalanceStages, docs/models.md §4.6). An interface,
// so that the space stays free of the cost model.
class StageSplitter {
 public:
  virtual ~StageSplitter() = default;
  // Sets c.pp_first and c.pp_last (and with `choose_recompute_layers` c.recompute_layers) to a
  // split Megatron accepts; false when c's pp and vpp admit none.
  virtual bool Split(ParallelConfig& c, bool choose_recompute_layers) const = 0;
};

class SearchSpace {
 public:
  // Throws InputError naming the flag when a restricted value can never satisfy a constraint
  // (e.g. `--tp 3` with 32 heads), so the user learns why rather than getting an empty space.
  //
  // Without a splitter every stage holds num_layers/pp layers, so pp·vpp must divide the layers.
  // With one, any pp and vpp with pp·vpp ≤ num_layers is a candidate and each configuration the
  // space yields carries the split the splitter chose (and, under full recompute with no
  // recompute_layers given or swept, its depth); `splitter` must outlive the space.
  SearchSpace(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster,
              SpaceOptions options, const StageSplitter* splitter = nullptr);

  // Empty when `c` is valid, else the first violated constraint in words.
  std::string Check(const ParallelConfig& c) const;

  // Calls fn(const ParallelConfig&) for every valid configuration, in a fixed order.
  template <class Fn>
  void ForEach(Fn&& fn) const;

  int64_t Count() const;

  const ModelSpec& model() const { return model_; }
  const TrainSpec& train() const { return train_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const SpaceOptions& options() const { return options_; }

 private:
  // Candidate values per dimension, after applying the options and the per-dimension constraints.
  std::vector<int32_t> TpValues() const;
  std::vector<int32_t> PpValues() const;
  std::vector<int32_t> SeqSplitValues(const std::vector<int32_t>& allowed) const;
  // The (etp, ep) pairs for tensor parallel size `tp` over an expert block of `expert_block` =
  // tp·cp·dp ranks, etp outer (0 standing for tp itself, the canonical form); dense models (0, 1).
  struct ExpertSplit {
    int32_t etp, ep;
  };
  std::vector<ExpertSplit> ExpertSplits(int32_t tp, int64_t expert_block) const;
  std::vector<int32_t> EtpValues(int32_t tp, int64_t expert_block) const;
  std::vector<int32_t> EpValues(int64_t ep_ranks) const;
  std::vector<int32_t> VppValues(int32_t pp) const;
  std::vector<int32_t> MbsValues(int64_t batch_per_replica) const;
  std::vector<int32_t> RecomputeLayerValues(int32_t layers_per_stage) const;
  // The values of the knobs that do not shape the layout (the options, or every value / the
  // default where a list is empty), and the sequence splits, taken once per ForEach.
  struct KnobValues {
    std::vector<int32_t> cp, up;
    std::vector<bool> sp, dist_opt, overlap_grad_reduce, overlap_param_gather, cp_allgather,
        fp8_param_gather;
    std::vector<Recompute> recompute;
    std::vector<GradReduceDtype> grad_reduce_dtype;
    bool choose_depth = false;  // the splitter chooses the full-recompute depth
  };
  KnobValues Knobs() const;
  // ForEach's inner nest: every knob combination over the layout c already holds.
  template <class Fn>
  void ForEachKnob(ParallelConfig c, const KnobValues& knobs,
                   const std::vector<int32_t>& full_layer_counts, Fn& fn) const;
  // ForEachKnob's nest below the sequence split's communication: sp, recompute, the optimizer
  // and the data-parallel overlap.
  template <class Fn>
  void ForEachRecomputeKnob(ParallelConfig c, const KnobValues& knobs,
                            const std::vector<int32_t>& full_layer_counts, Fn& fn) const;
  void ValidateOptions() const;
  bool UlyssesKvFits(int32_t tp, int32_t up) const;

  ModelSpec model_;
  TrainSpec train_;
  ClusterSpec cluster_;
  SpaceOptions options_;
  const StageSplitter* splitter_ = nullptr;
};

namespace space_detail {
inline bool Contains(const std::vector<int32_t>& values, int64_t v) {
  for (int32_t x : values) {
    if (x == v) return true;
  }
  return false;
}
}  // namespace space_detail

template <class Fn>
void SearchSpace::ForEach(Fn&& fn) const {
  const KnobValues knobs = Knobs();
  const int64_t world = cluster_.world_size();
  ParallelConfig c;
  for (int32_t tp : TpValues()) {
    c.tp = tp;
    for (int32_t up : knobs.up) {
      c.up = up;
      if (world % (int64_t{tp} * up) != 0) continue;
      if (model_.num_attention_heads % (int64_t{tp} * up) != 0) continue;
      if (!UlyssesKvFits(tp, up)) continue;
      for (int32_t cp : knobs.cp) {
        c.cp = cp;
        const int64_t seq_split = int64_t{cp} * up;
        if (seq_split > 1 && train_.seq_length % (2 * seq_split) != 0) continue;
        for (int32_t pp : PpValues()) {
          c.pp = pp;
          const int64_t mp = int64_t{tp} * up * cp * pp;
          if (world % mp != 0) continue;
          const int64_t dp = world / mp;
          if (!options_.dp.empty() && !space_detail::Contains(options_.dp, dp)) continue;
          if (train_.global_batch_size % dp != 0) continue;
          c.dp = static_cast<int32_t>(dp);
          const std::vector<int32_t> full_layer_counts =
              RecomputeLayerValues(static_cast<int32_t>(model_.num_layers / pp));
          const int64_t batch_per_replica = train_.global_batch_size / dp;
          for (const ExpertSplit& split : ExpertSplits(tp, int64_t{tp} * cp * dp)) {
            c.etp = split.etp;
            c.ep = split.ep;
            // The job's flex dispatcher needs ranks to dispatch over (Megatron asserts it).
            if (options_.flex_dispatcher && int64_t{c.expert_tp()} * c.ep == 1) continue;
            c.flex_dispatcher = options_.flex_dispatcher;
            for (int32_t mbs : MbsValues(batch_per_replica)) {
              c.mbs = mbs;
              const int64_t microbatches = batch_per_replica / mbs;
              for (int32_t vpp : VppValues(pp)) {
                // Megatron's interleaved schedule runs micro-batches in groups of pp.
                if (vpp > 1 && microbatches % pp != 0) continue;
                c.vpp = vpp;
                ForEachKnob(c, knobs, full_layer_counts, fn);
              }
            }
          }
        }
      }
    }
  }
}

template <class Fn>
void SearchSpace::ForEachKnob(ParallelConfig c, const KnobValues& knobs,
                              const std::vector<int32_t>& full_layer_counts, Fn& fn) const {
  static const std::vector<bool> kOff = {false};
  // Megatron-LM takes the all-gather for the ring alone: not with Ulysses (a2a+p2p is p2p).
  for (bool allgather : c.cp > 1 && c.up == 1 ? knobs.cp_allgather : kOff) {
    // A windowed model's attention takes no p2p ring (WindowRingReason).
    if (c.cp > 1 && !allgather && model_.window_size > 0) continue;
    c.cp_allgather = allgather;
    ForEachRecomputeKnob(c, knobs, full_layer_counts, fn);
  }
}

template <class Fn>
void SearchSpace::ForEachRecomputeKnob(ParallelConfig c, const KnobValues& knobs,
                                       const std::vector<int32_t>& full_layer_counts,
                                       Fn& fn) const {
  static const std::vector<int32_t> kEveryLayer = {0};
  static const std::vector<bool> kOff = {false};
  // FP8 parameters in every candidate: each one has the distributed optimizer they need.
  const bool fp8_params_pinned = knobs.fp8_param_gather == std::vector<bool>{true};
  for (bool sp : knobs.sp) {
    if (sp && c.tp == 1) continue;
    // Megatron-core runs MoE layers under tensor parallelism only with SP.
    if (!sp && c.tp > 1 && model_.is_moe()) continue;
    c.sp = sp;
    for (Recompute r : knobs.recompute) {
      c.recompute = r;
      c.recompute_modules = r == Recompute::kSelective ? options_.recompute_modules : 0;
      for (int32_t layers : r == Recompute::kFull ? full_layer_counts : kEveryLayer) {
        c.recompute_layers = layers;
        for (bool dist_opt : knobs.dist_opt) {
          // With one replica (Megatron shards over dp·cp, its cp being cp·up) there is nothing
          // to distribute over, unless FP8 parameters need it (Megatron runs it there).
          if (dist_opt && int64_t{c.dp} * c.cp * c.up == 1 && !fp8_params_pinned) continue;
          if (!dist_opt && fp8_params_pinned) continue;
          c.dist_opt = dist_opt;
          for (bool grad_overlap : knobs.overlap_grad_reduce) {
            c.overlap_grad_reduce = grad_overlap;
            // Where Megatron refuses --overlap-param-gather, the gather is not overlapped
            // whatever the option says.
            for (bool gather_overlap :
                 OverlapParamGatherAllowed(c) ? knobs.overlap_param_gather : kOff) {
              c.overlap_param_gather = gather_overlap;
              for (GradReduceDtype dtype : knobs.grad_reduce_dtype) {
                c.grad_reduce_dtype = dtype;
                for (bool fp8_params : dist_opt ? knobs.fp8_param_gather : kOff) {
                  c.fp8_param_gather = fp8_params;
                  if (splitter_ == nullptr) {
                    fn(static_cast<const ParallelConfig&>(c));
                    continue;
                  }
                  ParallelConfig staged = c;
                  if (splitter_->Split(staged, knobs.choose_depth)) {
                    fn(static_cast<const ParallelConfig&>(staged));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace autopar
