// `plan` and `predict`: the analytic model alone, no MPI and no trials.
#include <chrono>
#include <optional>

#include "autopar/cli/commands.h"
#include "autopar/cli/inputs.h"
#include "autopar/cli/plan_format.h"
#include "autopar/common/errors.h"
#include "autopar/perf/ranking.h"

namespace autopar::cli {
namespace {

// Pasted Megatron parallel flags describe one configuration: pin every dimension they set.
void PinSpace(const ParallelConfig& c, const ModelSpec& model, SpaceOptions& space) {
  space.tp = {c.tp};
  space.pp = {c.pp};
  space.cp = {c.cp};
  space.ep = {c.ep};
  if (model.is_moe()) space.etp = {c.expert_tp()};
  space.vpp = {c.vpp};
  space.mbs = {c.mbs};
  space.sp = {c.sp};
  space.dist_opt = {c.dist_opt};
  space.recompute = {c.recompute};
  space.recompute_layers = {c.recompute_layers};
  space.overlap_grad_reduce = {c.overlap_grad_reduce};
  space.overlap_param_gather = {c.overlap_param_gather};
  // The numerics knobs as --fix pins them, else as the configuration has them (as predict).
  if (space.grad_reduce_dtype.empty()) space.grad_reduce_dtype = {c.grad_reduce_dtype};
  if (space.fp8_param_gather.empty()) space.fp8_param_gather = {c.fp8_param_gather};
}

// Why `c` is not a valid configuration of this job, judged by the space without the user's
// restrictions, so the reason names the broken constraint ("" when valid).
std::string ValidityReason(const Inputs& in, const ParallelConfig& c) {
  SpaceOptions open = in.space;
  open.tp_across_nodes = true;
  return SearchSpace(in.model, in.train, in.cluster, open).Check(c);
}

// The note on an uneven pipeline's stages: what the balancer chose and what it equalised (each
// stage's forward + backward of one micro-batch, and its memory).
void WriteStagesNote(std::ostream& err, const char* command, const CostModel& model,
                     const ParallelConfig& c, const Estimate& e) {
  if (!UnevenStages(c)) return;
  const std::vector<CostModel::StageEstimate> stages = model.Stages(c);
  double fastest = stages.front().time_s, slowest = fastest;
  double least = stages.front().memory_gib, most = least;
  int64_t slowest_stage = 0;
  std::string layers;
  for (size_t i = 0; i < stages.size(); ++i) {
    const CostModel::StageEstimate& s = stages[i];
    layers += (i == 0 ? "" : "|") + std::to_string(s.layers);
    fastest = std::min(fastest, s.time_s);
    if (s.time_s > slowest) {
      slowest = s.time_s;
      slowest_stage = static_cast<int64_t>(i);
    }
    least = std::min(least, s.memory_gib);
    most = std::max(most, s.memory_gib);
  }
  const std::ios::fmtflags flags = err.flags();
  const std::streamsize precision = err.precision(4);
  err << "autopar-tune " << command << ": note: " << ToSpec(c) << ": uneven pipeline stages of "
      << layers << " layers, MFU " << e.mfu * 100
      << "%; one micro-batch's forward and backward takes " << fastest << " to " << slowest
      << " s per stage (slowest: stage " << slowest_stage << "), memory " << least << " to " << most
      << " GiB per stage\n";
  err.flags(flags);
  err.precision(precision);
}

}  // namespace

int RunPlan(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(argv, "plan");
  const int64_t top = args.Int("--top", 5);
  const bool breakdown = args.Switch("--breakdown");
  Inputs in = ReadInputs(args);
  WriteNotes(err, "plan", in);
  if (in.megatron_config) {
    if (!in.megatron_uneven_flag.empty()) {
      err << "autopar-tune plan: note: " << in.megatron_uneven_flag
          << " is not pinned: plan splits each pipeline's layers itself (the stage balancer); "
             "predict gives the time of a given split\n";
    }
    PinSpace(*in.megatron_config, in.model, in.space);
  }

  const auto start = std::chrono::steady_clock::now();
  const CostModel model(in.model, in.train, in.cluster, in.constants);
  // Pipelines with uneven stages, each split (and recompute depth) chosen by the balancer.
  const StageBalancer balancer(model);
  const SearchSpace space(in.model, in.train, in.cluster, in.space, &balancer);
  // A pasted script's own configuration: the search goes around it and says where it ranks.
  std::optional<Ranked> script;
  if (in.script_config) {
    // A script written for another cluster size may not complete here (its tp·cp·pp does not
    // divide this world): noted like any other invalid configuration, and the search goes on.
    ParallelConfig c = *in.script_config;
    std::string reason;
    try {
      c = Complete(c, in.cluster.world_size());
      reason = ValidityReason(in, c);
    } catch (const InputError& e) {
      reason = e.what();
    }
    if (reason.empty()) {
      script = Ranked{c, model.Evaluate(c)};
    } else {
      err << "autopar-tune plan: note: the script's configuration " << ToSpec(c)
          << " is not valid here: " << reason << "\n";
    }
  }
  const Ranking ranking = RankSpace(
      space, model, top, script && script->estimate.fits ? script->estimate.time.step_time_s : 0);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (ranking.candidates == 0) {
    err << "autopar-tune plan: no configuration satisfies the constraints of docs/architecture.md §3 for "
        << in.model.name << " on " << in.cluster.world_size() << " GPUs with these restrictions\n";
    return kExitInfeasible;
  }
  if (ranking.feasible == 0) {
    err << "autopar-tune plan: none of the " << ranking.candidates
        << " configurations fits in memory: the smallest needs " << ranking.min_memory_gib
        << " GiB per GPU, the GPU has " << in.cluster.gpu.memory_gib << " GiB\n";
    return kExitInfeasible;
  }
  std::vector<Ranked> ranked;
  for (const RankedConfig& r : ranking.top) ranked.push_back({r.config, r.estimate});
  WriteRanked(out, in.format, in, {ranking.candidates, ranking.feasible, elapsed}, ranked,
              breakdown);
  WriteStagesNote(err, "plan", model, ranked.front().config, ranked.front().estimate);
  if (script) {
    const Estimate& e = script->estimate;
    err << "autopar-tune plan: the script's configuration " << ToSpec(script->config);
    if (!e.fits) {
      err << " does not fit: it needs " << e.peak_memory_gib << " GiB per GPU, the GPU has "
          << in.cluster.gpu.memory_gib << "\n";
    } else {
      const double best = ranking.top.front().estimate.time.step_time_s;
      err << " ranks " << ranking.faster_than_reference + 1 << " of " << ranking.feasible << ": "
          << e.time.step_time_s << " s per step, " << (e.time.step_time_s / best - 1) * 100
          << "% slower than the best\n";
    }
  }
  return kExitOk;
}

int RunPredict(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  Args args(argv, "predict");
  const auto spec = args.Value("--config");
  Inputs in = ReadInputs(args);
  WriteNotes(err, "predict", in);
  ParallelConfig c;
  if (spec) {
    c = ParseSpec(*spec);
  } else if (in.megatron_config) {
    c = *in.megatron_config;
  } else if (in.script_config) {
    c = *in.script_config;
  } else {
    throw InputError("--config", "required: a SPEC such as tp=8,pp=4,mbs=1,sp=on (or Megatron "
                                 "flags such as --tensor-model-parallel-size)");
  }
  c = Complete(c, in.cluster.world_size());
  const CostModel model(in.model, in.train, in.cluster, in.constants);
  // pp alone, where the layers do not split evenly: the balancer's split, said in a note.
  if (!UnevenStages(c) && !StageSplitError(c, in.model.num_layers).empty() &&
      model.BalanceStages(c, false)) {
    err << "autopar-tune predict: note: " << in.model.num_layers << " layers do not split evenly "
        << "over pp=" << c.pp << (c.vpp > 1 ? " x vpp=" + std::to_string(c.vpp) : "")
        << "; predicting the balanced split "
        << (c.split_embedding || c.split_loss
                ? std::string(c.split_embedding ? "split_embedding=on" : "") +
                      (c.split_embedding && c.split_loss ? "," : "") +
                      (c.split_loss ? "split_loss=on" : "")
                : "pp_first=" + std::to_string(c.pp_first) +
                      ",pp_last=" + std::to_string(c.pp_last))
        << "\n";
  }
  // Pins of the overlap and dtype knobs (--fix, --no-overlap-*) apply to the one configuration.
  const SpaceOptions& pins = in.space;
  if (pins.overlap_grad_reduce.size() == 1) {
    c.overlap_grad_reduce = pins.overlap_grad_reduce[0];
    c.overlap_param_gather = c.overlap_param_gather && OverlapParamGatherAllowed(c);
  }
  if (pins.overlap_param_gather.size() == 1) {
    c.overlap_param_gather = pins.overlap_param_gather[0] && OverlapParamGatherAllowed(c);
  }
  if (pins.grad_reduce_dtype.size() == 1) c.grad_reduce_dtype = pins.grad_reduce_dtype[0];
  if (pins.fp8_param_gather.size() == 1) c.fp8_param_gather = pins.fp8_param_gather[0];
  if (const std::string reason = ValidityReason(in, c); !reason.empty()) {
    throw InputError("--config", reason);
  }
  const Estimate estimate = model.Evaluate(c);
  WriteRanked(out, in.format, in, {}, {{c, estimate}}, /*with_breakdown=*/true);
  WriteStagesNote(err, "predict", model, c, estimate);
  // The estimate is printed either way; a configuration that does not fit is not a plan
  // (exit 3, as `plan` with nothing that fits).
  if (!estimate.fits) {
    err << "autopar-tune predict: " << ToSpec(c) << " needs " << estimate.peak_memory_gib
        << " GiB per GPU, more than the " << in.cluster.gpu.memory_gib << " GiB available\n";
    return kExitInfeasible;
  }
  return kExitOk;
}

}  // namespace autopar::cli
