#include "autopar/space/space.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "autopar/common/errors.h"

namespace autopar {
namespace {

std::vector<int32_t> Divisors(int64_t n, int64_t at_most) {
  std::vector<int32_t> out;
  for (int64_t d = 1; d <= n && d <= at_most; ++d) {
    if (n % d == 0) out.push_back(static_cast<int32_t>(d));
  }
  return out;
}

std::vector<int32_t> PowersOfTwo(int64_t at_most) {
  std::vector<int32_t> out;
  for (int64_t v = 1; v <= at_most; v *= 2) out.push_back(static_cast<int32_t>(v));
  return out;
}

// Keeps the values of `wanted` (or of `defaults` when `wanted` is empty) that satisfy `ok`.
template <class Ok>
std::vector<int32_t> Select(const std::vector<int32_t>& wanted,
                            const std::vector<int32_t>& defaults, Ok ok) {
  std::vector<int32_t> out;
  for (int32_t v : wanted.empty() ? defaults : wanted) {
    if (ok(v)) out.push_back(v);
  }
  return out;
}

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

SearchSpace::SearchSpace(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster,
                         SpaceOptions options, const StageSplitter* splitter)
    : model_(model),
      train_(train),
      cluster_(cluster),
      options_(std::move(options)),
      splitter_(splitter) {
  Validate(model_);
  Validate(train_);
  Validate(cluster_);
  ValidateOptions();
}

// Constraints that involve one dimension only. Kept in one place so that Check() (one config)
// and the enumeration (whole space) agree; the per-dimension value lists below apply them.
namespace {
std::string TpReason(const ModelSpec& m, const ClusterSpec& cl, bool across_nodes, int64_t tp) {
  if (m.num_attention_heads % tp != 0) {
    return "tp=" + Str(tp) + " does not divide num_attention_heads=" + Str(m.num_attention_heads);
  }
  if (m.num_query_groups % tp != 0 && tp % m.num_query_groups != 0) {
    return "tp=" + Str(tp) + " neither divides nor is a multiple of num_query_groups=" +
           Str(m.num_query_groups);
  }
  if (m.ffn_hidden_size % tp != 0) {
    return "tp=" + Str(tp) + " does not divide ffn_hidden_size=" + Str(m.ffn_hidden_size);
  }
  if (cl.world_size() % tp != 0) {
    return "tp=" + Str(tp) + " does not divide the world size " + Str(cl.world_size());
  }
  // Tensor parallelism talks on every layer: its groups stay inside one NVLink domain (a node,
  // or an NVL72 rack's 72 GPUs across its trays), aligned blocks of tp consecutive ranks.
  const int64_t domain = cl.NvlinkDomainGpus();
  if (!across_nodes && (tp > domain || domain % tp != 0)) {
    return "tp=" + Str(tp) + " does not fit in an NVLink domain of " + Str(domain) +
           " GPUs (pass --tp-across-nodes to allow it)";
  }
  return {};
}

// Ulysses is Megatron's all-to-all context parallelism (--cp-comm-type a2a, or a2a+p2p with the
// ring): Transformer Engine scatters each tp rank's query and key/value heads over the up ranks and
// asserts both counts divisible by up ("The number of attention heads needs to be divisible by CP
// size!"). Megatron keeps num_query_groups / tp kv heads per tp rank, one (replicated) when tp
// exceeds num_query_groups, so up must divide that count: nothing is replicated over up. MLA's
// keys and values have one head per query head, which heads % (tp·up) already covers.
std::string UlyssesKvReason(const ModelSpec& m, int64_t tp, int64_t up) {
  if (up == 1 || m.is_mla()) return {};
  const int64_t kv = std::max<int64_t>(m.num_query_groups / tp, 1);
  if (kv % up == 0) return {};
  return "up=" + Str(up) + " does not divide the " + Str(kv) +
         " key/value heads per tp rank (num_query_groups=" + Str(m.num_query_groups) +
         " over tp=" + Str(tp) +
         "); Transformer Engine's all-to-all context parallelism (--cp-comm-type a2a) scatters "
         "them over the up ranks";
}

// Sliding-window attention and the ring's p2p (Megatron's --cp-comm-type p2p, also inside
// a2a+p2p): Transformer Engine's attention with context parallelism asserts that a window runs
// only with the a2a or all-gather types ("The context parallel running configs cannot support
// sliding window attention"), so a windowed model splits its sequence by Ulysses or by the
// all-gathered ring (cp_comm=allgather).
std::string WindowRingReason(const ModelSpec& m, int64_t cp, bool allgather) {
  if (cp == 1 || m.window_size == 0 || allgather) return {};
  return "cp=" + Str(cp) + ": a sliding-window model (window_size=" + Str(m.window_size) +
         ") cannot use the ring's p2p; Transformer Engine runs windows with context parallelism "
         "only by all-to-all (up) or all-gathered K and V (cp_comm=allgather)";
}

std::string SeqSplitReason(const TrainSpec& t, const char* name, int64_t v) {
  if (v > 1 && t.seq_length % (2 * v) != 0) {
    return std::string(name) + "=" + Str(v) + ": seq_length=" + Str(t.seq_length) +
           " is not divisible by 2·" + name + "=" + Str(2 * v);
  }
  return {};
}

// The expert tensor parallel size alone (Megatron-core's rules for it, whatever tp is): the
// experts' width splits over it, and TransformerConfig asserts etp = 1 for MoE with biases.
std::string EtpReason(const ModelSpec& m, int64_t etp) {
  if (m.moe_ffn_hidden_size % etp != 0) {
    return "etp=" + Str(etp) + " does not divide moe_ffn_hidden_size=" + Str(m.moe_ffn_hidden_size);
  }
  if (m.add_bias_linear && etp != 1) {
    return "etp=" + Str(etp) +
           ": Megatron-core runs experts with biases (add_bias_linear) only at etp=1";
  }
  return {};
}

// MoE parallel folding (Megatron-core's expert grid, etp × ep × edp × pp = world): the routed
// experts are split over ep ranks and each expert's weights over etp; the grid folds into the
// tp·cp·dp ranks of one up slice and pipeline stage (docs/architecture.md §3), so etp·ep must
// divide tp·cp·dp. At etp = tp this is the earlier rule, ep | cp·dp.
// Selective recompute's modules must exist in the model, and Megatron-LM's own refusals are
// ours (transformer_config.py, __post_init__).
std::string RecomputeModulesReason(const ModelSpec& m, const TrainSpec& t, uint8_t modules) {
  const std::string names = RecomputeModulesText(modules);
  if (!m.is_moe() && (modules & (kRecomputeMoe | kRecomputeMoeAct | kRecomputeSharedExperts))) {
    return "recompute_modules=" + names + ": moe, moe_act and shared_experts need a MoE model (" +
           m.name + " has no experts)";
  }
  if ((modules & kRecomputeSharedExperts) && m.moe_shared_expert_intermediate_size == 0) {
    return "recompute_modules=" + names + ": " + m.name +
           " has no shared experts (--moe-shared-expert-intermediate-size)";
  }
  if ((modules & kRecomputeMlp) && m.is_moe() && m.moe_first_dense_layers == 0) {
    return "recompute_modules=" + names + ": mlp reruns dense MLPs, and every layer of " + m.name +
           " is a MoE layer (moe, moe_act and shared_experts rerun those)";
  }
  if (t.precision == Precision::kFP8 && (modules & (kRecomputeLayernorm | kRecomputeMoeAct))) {
    return "recompute_modules=" + names +
           ": Megatron-LM refuses layernorm and moe_act recompute with FP8's delayed scaling, its "
           "default recipe (the one modelled)";
  }
  return {};
}

// The job's dispatcher: flex moves a MoE model's tokens.
std::string DispatcherReason(const ModelSpec& m, bool flex) {
  if (!flex || m.is_moe()) return {};
  return "flex dispatches a mixture-of-experts model's tokens, and " + m.name +
         " has no experts (allowed: alltoall)";
}

std::string ExpertReason(const ModelSpec& m, const ParallelConfig& c) {
  if (!m.is_moe()) {
    if (c.ep != 1) return "ep > 1 needs a mixture-of-experts model";
    if (c.expert_tp() != c.tp) return "etp ≠ tp needs a mixture-of-experts model";
    if (c.flex_dispatcher) return "dispatcher=flex needs a mixture-of-experts model";
    return {};
  }
  if (c.flex_dispatcher && int64_t{c.expert_tp()} * c.ep == 1) {
    return "dispatcher=flex needs etp·ep > 1 (Megatron-LM's flex dispatcher asserts TPxEP > 1)";
  }
  if (m.num_experts % c.ep != 0) {
    return "ep=" + Str(c.ep) + " does not divide num_experts=" + Str(m.num_experts);
  }
  if (std::string r = EtpReason(m, c.expert_tp()); !r.empty()) return r;
  const int64_t block = int64_t{c.tp} * c.cp * c.dp, grid = int64_t{c.expert_tp()} * c.ep;
  if (block % grid != 0) {
    return "etp·ep = " + Str(grid) + " does not divide tp·cp·dp = " + Str(block) +
           " (the expert grid folds into the ranks of one up slice and pipeline stage)";
  }
  return {};
}

// A flag's value refused for `reason` (none when it is empty).
void FailIf(const char* flag, const std::string& reason) {
  if (!reason.empty()) throw InputError(flag, reason);
}

// Why FP8 parameters (fp8_param_gather) cannot be among `fp8_param_gather` with `dist_opt` (empty:
// both values) and `precision`; empty when they can.
std::string Fp8ParamGatherReason(Precision precision, const std::vector<bool>& fp8_param_gather,
                                 const std::vector<bool>& dist_opt) {
  const auto has = [](const std::vector<bool>& v, bool x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (!has(fp8_param_gather, true)) return {};
  if (precision != Precision::kFP8) {
    return "fp8_param_gather=on needs FP8 training (--fp8-format hybrid|e4m3)";
  }
  if (!dist_opt.empty() && !has(dist_opt, true)) {
    return "fp8_param_gather=on needs dist_opt=on (Megatron-LM asserts --fp8-param-gather only "
           "with a sharded optimizer)";
  }
  return {};
}

// --ep and --etp: positive, and only for a mixture-of-experts model whose experts they divide.
void ValidateExpertOptions(const ModelSpec& m, const SpaceOptions& options) {
  for (int32_t ep : options.ep) {
    if (ep < 1) throw InputError("--ep", "must be positive");
    if (ep > 1 && !m.is_moe()) {
      throw InputError("--ep", "ep=" + Str(ep) + " needs a mixture-of-experts model; " + m.name +
                                   " is dense (allowed: 1)");
    }
    if (m.is_moe() && m.num_experts % ep != 0) {
      throw InputError("--ep",
                       "ep=" + Str(ep) + " does not divide num_experts=" + Str(m.num_experts));
    }
  }
  for (int32_t etp : options.etp) {
    if (etp < 1) throw InputError("--etp", "must be positive");
    if (!m.is_moe()) {
      throw InputError("--etp", m.name +
                                    " is dense: its MLP splits over tp (etp applies to "
                                    "mixture-of-experts models only)");
    }
    FailIf("--etp", EtpReason(m, etp));
  }
}
}  // namespace

void SearchSpace::ValidateOptions() const {
  const int64_t world = cluster_.world_size();
  for (int32_t tp : options_.tp) {
    FailIf("--tp",
           tp < 1 ? "must be positive" : TpReason(model_, cluster_, options_.tp_across_nodes, tp));
  }
  for (int32_t pp : options_.pp) {
    if (splitter_ != nullptr) {  // uneven stages
      if (pp < 1 || pp > model_.num_layers || world % pp != 0) {
        throw InputError("--pp", "pp=" + Str(pp) +
                                     " must be at most num_layers=" + Str(model_.num_layers) +
                                     " and divide the world size " + Str(world));
      }
    } else if (pp < 1 || model_.num_layers % pp != 0 || world % pp != 0) {
      throw InputError("--pp", "pp=" + Str(pp) + " must divide num_layers=" +
                                   Str(model_.num_layers) + " and the world size " + Str(world));
    }
  }
  for (int32_t dp : options_.dp) {
    if (dp < 1 || world % dp != 0 || train_.global_batch_size % dp != 0) {
      throw InputError("--dp", "dp=" + Str(dp) + " must divide the world size " + Str(world) +
                                   " and global_batch_size=" + Str(train_.global_batch_size));
    }
  }
  for (int32_t cp : options_.cp) {
    FailIf("--cp", cp < 1 ? "must be positive" : SeqSplitReason(train_, "cp", cp));
    // Pinned to the p2p ring (--fix cp_comm=p2p), a windowed model has no cp.
    const bool gather_allowed = options_.cp_allgather != std::vector<bool>{false};
    FailIf("--cp", WindowRingReason(model_, cp, gather_allowed));
  }
  for (int32_t up : options_.up) {
    FailIf("--up", up < 1 ? "must be positive" : SeqSplitReason(train_, "up", up));
    if (model_.num_attention_heads % up != 0) {
      throw InputError("--up", "up=" + Str(up) + " does not divide num_attention_heads=" +
                                   Str(model_.num_attention_heads));
    }
    // The kv heads per tp rank only shrink as tp grows: what fails at tp=1 fails everywhere.
    FailIf("--up", UlyssesKvReason(model_, 1, up));
  }
  ValidateExpertOptions(model_, options_);
  for (int32_t vpp : options_.vpp) {
    // With the embedding and/or the loss counted in the split, pp·vpp divides num_layers + 1
    // or + 2 (CountedSplits).
    const int64_t n = model_.num_layers;
    if (vpp < 1 || (n % vpp != 0 && (n + 1) % vpp != 0 && (n + 2) % vpp != 0)) {
      throw InputError("--vpp", "vpp=" + Str(vpp) + " must divide num_layers=" + Str(n) +
                                    " (or num_layers + 1 or + 2, the embedding and the loss "
                                    "counted in the split)");
    }
  }
  for (int32_t mbs : options_.mbs) {
    if (mbs < 1 || train_.global_batch_size % mbs != 0) {
      throw InputError("--micro-batch-size", "mbs=" + Str(mbs) +
                                                 " must divide global_batch_size=" +
                                                 Str(train_.global_batch_size));
    }
  }
  FailIf("--recompute-modules", RecomputeModulesReason(model_, train_, options_.recompute_modules));
  FailIf("--moe-token-dispatcher-type", DispatcherReason(model_, options_.flex_dispatcher));
  for (int32_t n : options_.recompute_layers) {
    if (n < 0 || n > model_.num_layers) {
      throw InputError("--recompute-num-layers",
                       "must be between 0 (every layer) and num_layers=" + Str(model_.num_layers));
    }
  }
  if (options_.sp.size() == 1 && options_.sp[0] && options_.tp.size() == 1 &&
      options_.tp[0] == 1) {
    throw InputError("--fix", "sp=on needs tp > 1");
  }
  // Megatron-LM asserts --overlap-param-gather only with the distributed optimizer and
  // --overlap-grad-reduce (megatron/training/arguments.py).
  const bool gather_pinned_on =
      options_.overlap_param_gather.size() == 1 && options_.overlap_param_gather[0];
  if (gather_pinned_on && options_.dist_opt.size() == 1 && !options_.dist_opt[0]) {
    throw InputError("--fix", "overlap_param_gather=on needs dist_opt=on");
  }
  if (gather_pinned_on && options_.overlap_grad_reduce.size() == 1 &&
      !options_.overlap_grad_reduce[0]) {
    throw InputError("--fix", "overlap_param_gather=on needs overlap_grad_reduce=on");
  }
  FailIf("--fix",
         Fp8ParamGatherReason(train_.precision, options_.fp8_param_gather, options_.dist_opt));
}

std::string SearchSpace::Check(const ParallelConfig& c) const {
  const int64_t world = cluster_.world_size();
  if (c.tp < 1 || c.pp < 1 || c.dp < 1 || c.cp < 1 || c.up < 1 || c.ep < 1 || c.etp < 0 ||
      c.vpp < 1 || c.mbs < 1 || c.recompute_layers < 0) {
    return "every degree must be positive";
  }
  if (c.world_size() != world) {
    return "tp·cp·up·dp·pp = " + Str(c.world_size()) + " but the world size is " + Str(world);
  }
  if (std::string r = TpReason(model_, cluster_, options_.tp_across_nodes, c.tp); !r.empty()) {
    return r;
  }
  if (model_.num_attention_heads % (int64_t{c.tp} * c.up) != 0) {
    return "tp·up = " + Str(int64_t{c.tp} * c.up) + " does not divide num_attention_heads=" +
           Str(model_.num_attention_heads);
  }
  if (std::string r = StageSplitError(c, model_.num_layers); !r.empty()) return r;
  int64_t largest_stage = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    largest_stage = std::max(largest_stage, StageLayers(c, model_.num_layers, stage));
  }
  if (c.vpp > 1 && c.pp == 1) return "vpp > 1 needs pp > 1";
  if (std::string r = SeqSplitReason(train_, "cp·up", int64_t{c.cp} * c.up); !r.empty()) return r;
  if (train_.global_batch_size % (int64_t{c.dp} * c.mbs) != 0) {
    return "dp·mbs = " + Str(int64_t{c.dp} * c.mbs) + " does not divide global_batch_size=" +
           Str(train_.global_batch_size);
  }
  const int64_t microbatches = train_.global_batch_size / (int64_t{c.dp} * c.mbs);
  if (c.vpp > 1 && microbatches % c.pp != 0) {
    return "the interleaved schedule runs micro-batches in groups of pp=" + Str(c.pp) + "; " +
           Str(microbatches) + " micro-batches is not a multiple";
  }
  if (std::string r = ExpertReason(model_, c); !r.empty()) return r;
  if (c.sp && c.tp == 1) return "sp=on needs tp > 1";
  if (model_.is_moe() && c.tp > 1 && !c.sp) {
    return "mixture-of-experts layers with tp > 1 need sp=on (Megatron-core refuses them without)";
  }
  if (std::string r = UlyssesKvReason(model_, c.tp, c.up); !r.empty()) return r;
  if (std::string r = WindowRingReason(model_, c.cp, c.cp_allgather); !r.empty()) return r;
  if (c.cp_allgather && (c.cp == 1 || c.up > 1)) {
    return "cp_comm=allgather needs cp > 1 and up = 1 (Megatron-LM gathers K and V over the "
           "ring's group alone; with Ulysses its a2a+p2p runs the ring)";
  }
  if (c.recompute_layers != 0 &&
      (c.recompute != Recompute::kFull || c.recompute_layers >= largest_stage)) {
    return "recompute_layers needs recompute=full and fewer than the " + Str(largest_stage) +
           " layers of the largest stage (0 recomputes every layer)";
  }
  if (c.recompute_modules != 0 && c.recompute != Recompute::kSelective) {
    return "recompute_modules needs recompute=selective";
  }
  if (std::string r = RecomputeModulesReason(model_, train_, c.selective_modules()); !r.empty()) {
    return r;
  }
  if (c.overlap_param_gather && !OverlapParamGatherAllowed(c)) {
    return "overlap_param_gather=on needs dist_opt=on and overlap_grad_reduce=on (Megatron-LM "
           "asserts both)";
  }
  return Fp8ParamGatherReason(train_.precision, {c.fp8_param_gather}, {c.dist_opt});
}

bool SearchSpace::UlyssesKvFits(int32_t tp, int32_t up) const {
  return UlyssesKvReason(model_, tp, up).empty();
}

int64_t SearchSpace::Count() const {
  int64_t n = 0;
  ForEach([&n](const ParallelConfig&) { ++n; });
  return n;
}

std::vector<int32_t> SearchSpace::TpValues() const {
  const int64_t limit =
      options_.tp_across_nodes ? cluster_.world_size() : cluster_.NvlinkDomainGpus();
  return Select(options_.tp, PowersOfTwo(limit), [&](int32_t tp) {
    return TpReason(model_, cluster_, options_.tp_across_nodes, tp).empty();
  });
}

std::vector<int32_t> SearchSpace::PpValues() const {
  if (splitter_ != nullptr) {  // uneven stages: every pp with a layer per stage
    return Select(options_.pp, Divisors(cluster_.world_size(), model_.num_layers),
                  [&](int32_t pp) { return pp <= model_.num_layers; });
  }
  return Select(options_.pp, Divisors(model_.num_layers, cluster_.world_size()),
                [&](int32_t pp) { return model_.num_layers % pp == 0; });
}

std::vector<int32_t> SearchSpace::SeqSplitValues(const std::vector<int32_t>& allowed) const {
  std::vector<int32_t> defaults = {1};
  if (train_.seq_length >= options_.long_sequence_threshold) {
    defaults = PowersOfTwo(cluster_.world_size());
  }
  return Select(allowed, defaults, [&](int32_t v) {
    return v == 1 || train_.seq_length % (2 * int64_t{v}) == 0;
  });
}

std::vector<SearchSpace::ExpertSplit> SearchSpace::ExpertSplits(int32_t tp,
                                                                int64_t expert_block) const {
  std::vector<ExpertSplit> out;
  for (int32_t etp : EtpValues(tp, expert_block)) {
    for (int32_t ep : EpValues(expert_block / (etp == 0 ? tp : etp))) out.push_back({etp, ep});
  }
  return out;
}

std::vector<int32_t> SearchSpace::EtpValues(int32_t tp, int64_t expert_block) const {
  if (!model_.is_moe()) return {0};
  std::vector<int32_t> out;
  for (int32_t etp : Select(options_.etp, Divisors(tp, tp), [&](int32_t etp) {
         return expert_block % etp == 0 && EtpReason(model_, etp).empty();
       })) {
    out.push_back(etp == tp ? 0 : etp);  // the canonical form
  }
  return out;
}

std::vector<int32_t> SearchSpace::EpValues(int64_t ep_ranks) const {
  if (!model_.is_moe()) return {1};
  return Select(options_.ep, Divisors(model_.num_experts, ep_ranks),
                [&](int32_t ep) { return ep_ranks % ep == 0 && model_.num_experts % ep == 0; });
}

std::vector<int32_t> SearchSpace::VppValues(int32_t pp) const {
  const int64_t layers_per_stage = model_.num_layers / pp;
  if (pp == 1) {
    return Select(options_.vpp, {1}, [](int32_t v) { return v == 1; });
  }
  if (splitter_ != nullptr) {
    // Chunks of equal size on each stage need vpp to divide the layers (pp_first/pp_last); the
    // embedding and/or the loss counted in the split need pp·vpp to divide the layers and them.
    auto splits = [&](int32_t v) {
      ParallelConfig c;
      c.pp = pp;
      c.vpp = v;
      return (model_.num_layers % v == 0 && int64_t{v} * pp <= model_.num_layers) ||
             !CountedSplits(c, model_.num_layers).empty();
    };
    std::vector<int32_t> candidates;
    for (int32_t v = 1; int64_t{v} * pp <= model_.num_layers + 2; ++v) {
      if (splits(v)) candidates.push_back(v);
    }
    return Select(options_.vpp, candidates, splits);
  }
  return Select(options_.vpp, Divisors(layers_per_stage, layers_per_stage),
                [&](int32_t v) { return layers_per_stage % v == 0; });
}

std::vector<int32_t> SearchSpace::MbsValues(int64_t batch_per_replica) const {
  return Select(options_.mbs, Divisors(batch_per_replica, options_.max_mbs),
                [&](int32_t m) { return batch_per_replica % m == 0; });
}

SearchSpace::KnobValues SearchSpace::Knobs() const {
  // An empty option is every value for the searched knobs and the default for the others
  // (SpaceOptions: overlap on, fp32 reduction).
  auto or_else = [](const auto& given, auto all) { return given.empty() ? all : given; };
  KnobValues k;
  // A sliding-window model's ring all-gathers (WindowRingReason; ForEachKnob skips its p2p).
  const bool p2p_only = options_.cp_allgather == std::vector<bool>{false};
  k.cp = model_.window_size > 0 && p2p_only ? std::vector<int32_t>{1} : SeqSplitValues(options_.cp);
  k.up = SeqSplitValues(options_.up);
  k.sp = or_else(options_.sp, std::vector<bool>{false, true});
  k.dist_opt = or_else(options_.dist_opt, std::vector<bool>{false, true});
  k.recompute =
      or_else(options_.recompute,
              std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  k.overlap_grad_reduce = or_else(options_.overlap_grad_reduce, std::vector<bool>{true});
  k.overlap_param_gather = or_else(options_.overlap_param_gather, std::vector<bool>{true});
  k.grad_reduce_dtype =
      or_else(options_.grad_reduce_dtype, std::vector<GradReduceDtype>{GradReduceDtype::kFP32});
  k.cp_allgather = or_else(options_.cp_allgather, std::vector<bool>{false, true});
  k.fp8_param_gather = or_else(options_.fp8_param_gather, std::vector<bool>{false});
  k.choose_depth = options_.recompute_layers.empty() && !options_.sweep_recompute_layers;
  return k;
}

std::vector<int32_t> SearchSpace::RecomputeLayerValues(int32_t layers_per_stage) const {
  std::vector<int32_t> defaults = {0};
  if (options_.sweep_recompute_layers) {
    for (int32_t n = 1; n < layers_per_stage; ++n) defaults.push_back(n);
  }
  return Select(options_.recompute_layers, defaults,
                [&](int32_t n) { return n < layers_per_stage; });
}

std::vector<int32_t> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int32_t> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int32_t v = 0;
    const char* end = item.data() + item.size();
    auto [ptr, ec] = std::from_chars(item.data(), end, v);
    if (item.empty() || ec != std::errc() || ptr != end || v < 0) {
      throw InputError(flag, "expected a comma-separated list of non-negative integers, got '" +
                                 text + "'");
    }
    out.push_back(v);
  }
  if (out.empty()) throw InputError(flag, "expected at least one value");
  return out;
}

void ApplyFix(const std::string& text, SpaceOptions& options) {
  // A pinned SPEC fragment: every key given becomes a one-value list.
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos) {
      throw InputError("--fix", "'" + item + "' is not key=value");
    }
    if (key == "etp") {  // not through ParseSpec, whose canonical form drops etp equal to tp
      const std::vector<int32_t> v = ParseIntList("--fix", item.substr(eq + 1));
      if (v.size() != 1 || v[0] < 1) {
        throw InputError("--fix", "key 'etp' needs a positive integer, got '" + item + "'");
      }
      options.etp = v;
      continue;
    }
    // Parse the fragment with the SPEC parser so the allowed values are the same.
    ParallelConfig c;
    try {
      c = ParseSpec(key == "recompute_layers"    ? "recompute=full," + item
                    : key == "recompute_modules" ? "recompute=selective," + item
                                                 : item);
    } catch (const InputError& e) {
      throw InputError("--fix", e.what());
    }
    if (key == "tp") options.tp = {c.tp};
    else if (key == "pp") options.pp = {c.pp};
    else if (key == "dp") options.dp = {c.dp};
    else if (key == "cp") options.cp = {c.cp};
    else if (key == "up") options.up = {c.up};
    else if (key == "ep") options.ep = {c.ep};
    else if (key == "vpp") options.vpp = {c.vpp};
    else if (key == "mbs") options.mbs = {c.mbs};
    else if (key == "sp") options.sp = {c.sp};
    else if (key == "dist_opt") options.dist_opt = {c.dist_opt};
    else if (key == "recompute") options.recompute = {c.recompute};
    else if (key == "recompute_layers") options.recompute_layers = {c.recompute_layers};
    else if (key == "recompute_modules")
      options.recompute_modules = c.recompute_modules;
    else if (key == "dispatcher")
      options.flex_dispatcher = c.flex_dispatcher;
    else if (key == "cp_comm")
      options.cp_allgather = {c.cp_allgather};
    else if (key == "overlap_grad_reduce") options.overlap_grad_reduce = {c.overlap_grad_reduce};
    else if (key == "overlap_param_gather") options.overlap_param_gather = {c.overlap_param_gather};
    else if (key == "grad_reduce_dtype") options.grad_reduce_dtype = {c.grad_reduce_dtype};
    else if (key == "fp8_param_gather")
      options.fp8_param_gather = {c.fp8_param_gather};
  }
}

}  // namespace autopar
