#include <iostream>

#include "autopar/cli/commands.h"
#include "autopar/cli/trial_cmd.h"
#include "autopar/cli/tune.h"
#include "autopar/common/status.h"
#include "autopar/spec/parse.h"

namespace autopar::cli {
namespace {

constexpr const char* kUsage = R"(usage: autopar-tune [COMMAND] [FLAGS]

commands:
  tune       (the default) the online search: --study DIR [--resume] [--seed N] [--budget 8h]
             [--max-trials N] [--trial-timeout 600] [--backend cpu|cuda|replay]
             [--p2p-semantics mpi|nccl]: the CPU backend's collectives as MPI or as NCCL runs them
             [--replay-table FILE.csv] [--searcher thompson|random|grid|analytic] [--quiet]
             [--max-p-oom 0.9]: never propose a configuration at least this likely to OOM
             [--warmup-iterations 2] [--timed-iterations 5] [--min-timed-seconds 0.5]: a trial
             times at least that many iterations, more (up to 100) until they add up to 0.5 s
             writes DIR/result.json, trials.csv, best.args
  make-replay-table   a synthetic replay table of the space: --output FILE.csv [--truth-seed N]
             [--world scaled|interactions|kernel|memory|noisy|near_memory|mixed]
  plan       rank the feasible space with the analytic model (no trials); --top K, --breakdown
  predict    one configuration: --config SPEC (tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=1,
             sp=on,recompute=selective,dist_opt=on; omitted keys take defaults)
  trial      under mpirun: one timed trial of --config SPEC's real training step
             [--backend cpu|cuda] [--p2p-semantics mpi|nccl] [--trial-timeout S] [--warmup N]
             [--iters N]
             [--min-timed-seconds S] [--max-microbatches N|-1] [--seed N]; exit 1 when its
             outcome is not ok
  probe      under mpirun: GEMM, attention and collective micro-benchmarks vs the model
  report     --study DIR [--top K] [--plot]: summary and trial table of a finished, running or
             interrupted study; --plot writes PNGs into DIR/plots (scripts/plot_study.py)

inputs:
  --model NAME|FILE.yaml|config.json   or Megatron flags (--num-layers --hidden-size ...)
  --megatron-args "TEXT" | --megatron-args-file FILE   a pasted Megatron-LM argument list
  --global-batch-size N --seq-length N [--bf16|--fp16|--fp8-format hybrid]
  --nnodes N --nproc-per-node N --gpu NAME|FILE.yaml --cluster FILE.yaml --device-memory-gib X
  --host-cores N   cores the ranks of a --gpu cpu job share (default with --backend cpu: this
                   host's; the CPU backend runs every rank on one host)
space:
  --tp/--pp/--dp/--cp/--up/--ep/--vpp/--mbs LIST   --recompute none,selective,full
  --fix KEY=VALUE,...   --tp-across-nodes   --sweep-recompute-layers   --max-mbs N
output:
  --format table|json|csv|megatron|yaml
exit codes: 0 ok, 2 bad input, 3 no feasible configuration, 4 study locked or mismatched
)";

}  // namespace

int Main(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
    out << kUsage;
    return argv.empty() ? kExitBadInput : kExitOk;
  }
  // No subcommand: flags go to `tune`, the default command (docs/cli.md §1).
  const bool implicit_tune = argv[0].rfind("--", 0) == 0;
  const std::string command = implicit_tune ? "tune" : argv[0];
  const std::vector<std::string> rest(argv.begin() + (implicit_tune ? 0 : 1), argv.end());
  try {
    if (command == "plan") return RunPlan(rest, out, err);
    if (command == "predict") return RunPredict(rest, out, err);
    if (command == "report") return RunReport(rest, out, err);
    if (command == "tune") return RunTune(rest, out, err);
    if (command == "make-replay-table") return RunMakeReplayTable(rest, out, err);
#if defined(AUTOPAR_WITH_TRIALS)
    if (command == "trial") return RunTrialCommand(rest, out, err);
    if (command == "probe") return RunProbeCommand(rest, out, err);
#endif
    if (command == "presets") {
      out << "models:";
      for (const auto& n : ModelPresetNames()) out << " " << n;
      out << "\ngpus:";
      for (const auto& n : GpuPresetNames()) out << " " << n;
      out << "\n";
      return kExitOk;
    }
    err << "autopar-tune: unknown command '" << command
        << "'; allowed: plan, predict, report, presets, tune, make-replay-table, trial, probe\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    err << "autopar-tune " << command << ": " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::runtime_error& e) {  // the environment failed us (MPI, files)
    err << "autopar-tune " << command << ": " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace autopar::cli
