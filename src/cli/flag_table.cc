// The flag table (help.h): every flag of every command, once. A flag's row says what `Args`
// accepts of its value; the code that reads it adds only what depends on other flags (--salvage
// only with --resume, --replay-table only with --backend replay, ...). Megatron-LM's own flags are
// listed for the help and README; their parsers are spec/parse.h's and megatron_script_reader.cc.
#include <cstdint>
#include <limits>
#include <string>

#include "autopar/cli/help.h"
#include "autopar/spec/bounds.h"
#include "src/cli/flag_values.h"

namespace autopar::cli {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

FlagHelp Switch(const char* flag, const char* meaning) {
  return {flag, "", meaning, FlagType::kSwitch};
}
FlagHelp Text(const char* flag, const char* value, const char* meaning) {
  return {flag, value, meaning, FlagType::kText};
}
FlagHelp Choice(const char* flag, const char* values, const char* meaning) {
  return {flag, values, meaning, FlagType::kChoice};
}
FlagHelp Int(const char* flag, const char* value, const char* meaning, int64_t min = 1,
             int64_t max = kMaxIntFlag) {
  return {flag, value, meaning, FlagType::kInt, min, max};
}
FlagHelp Unsigned(const char* flag, const char* value, const char* meaning) {
  return {flag, value, meaning, FlagType::kUnsigned};
}
FlagHelp Number(const char* flag, const char* value, const char* meaning,
                double max_number = 1e15) {
  FlagHelp f{flag, value, meaning, FlagType::kNumber};
  f.max_number = max_number;
  return f;
}
FlagHelp Duration(const char* flag, const char* value, const char* meaning) {
  return {flag, value, meaning, FlagType::kDuration};
}
FlagHelp Megatron(const char* flag, const char* value, const char* meaning = "") {
  return {flag, value, meaning, FlagType::kMegatron};
}

// ---- the flag groups several commands share (docs/cli.md §2-§4) ----

const FlagGroup kInputs = {
    "model, job and cluster (docs/cli.md §2)",
    {
        Text("--model", "NAME|FILE.yaml|config.json",
             "preset, YAML ModelSpec or Hugging Face config"),
        Text("--megatron-args", "\"TEXT\"", "a pasted Megatron-LM argument list or script"),
        Text("--megatron-args-file", "FILE", "the same, from a file"),
        Text("--megatron-env", "NAME=V[,...]", "values of the pasted script's $NAMEs"),
        Megatron("--global-batch-size", "N", "sequences per optimizer step (required)"),
        Megatron("--seq-length", "N", "tokens per sequence (min(max_position_embeddings, 4096))"),
        Megatron("--bf16", "", "bf16 training (the default)"),
        Megatron("--fp16", "", "fp16 training"),
        Megatron("--fp8-format", "e4m3|hybrid", "fp8 GEMMs"),
        Text("--gpu", "NAME|FILE.yaml",
             "GPU preset or YAML (a100-80gb, with a note on stderr; required with --backend cuda)"),
        Text("--cluster", "FILE.yaml", "nnodes, gpus_per_node and gpu"),
        Int("--nnodes", "N", "nodes (1)", 1, bounds::kMaxGpus),
        Int("--nproc-per-node", "N", "GPUs per node (8)", 1, kMaxGpusPerNode),
        Number("--device-memory-gib", "X", "usable memory per GPU (the GPU's)", 1e6),
        Int("--host-cores", "N", "cores the ranks of a --gpu cpu job share (only with --gpu cpu)",
            1, int64_t{1} << 20),
    }};

const FlagGroup kMegatronModel = {"Megatron-LM model flags, on top of --model (docs/cli.md §2)",
                                  {
                                      Megatron("--num-layers", "N"),
                                      Megatron("--hidden-size", "N"),
                                      Megatron("--ffn-hidden-size", "N"),
                                      Megatron("--num-attention-heads", "N"),
                                      Megatron("--num-query-groups", "N"),
                                      Megatron("--group-query-attention", ""),
                                      Megatron("--kv-channels", "N"),
                                      Megatron("--vocab-size", "N"),
                                      Megatron("--tokenizer-type", "NAME"),
                                      Megatron("--make-vocab-size-divisible-by", "N"),
                                      Megatron("--max-position-embeddings", "N"),
                                      Megatron("--swiglu", ""),
                                      Megatron("--normalization", "NAME"),
                                      Megatron("--position-embedding-type", "NAME"),
                                      Megatron("--use-rotary-position-embeddings", ""),
                                      Megatron("--untie-embeddings-and-output-weights", ""),
                                      Megatron("--disable-bias-linear", ""),
                                      Megatron("--qk-layernorm", ""),
                                      Megatron("--multi-latent-attention", ""),
                                      Megatron("--q-lora-rank", "N"),
                                      Megatron("--kv-lora-rank", "N"),
                                      Megatron("--qk-head-dim", "N"),
                                      Megatron("--qk-pos-emb-head-dim", "N"),
                                      Megatron("--v-head-dim", "N"),
                                      Megatron("--num-experts", "N"),
                                      Megatron("--moe-router-topk", "K"),
                                      Megatron("--moe-ffn-hidden-size", "N"),
                                      Megatron("--moe-shared-expert-intermediate-size", "N"),
                                      Megatron("--moe-layer-freq", "PATTERN"),
                                      Megatron("--window-size", "LEFT,0"),
                                      Megatron("--window-attn-skip-freq", "N"),
                                      Megatron("--mtp-num-layers", "N"),
                                  },
                                  /*compact=*/true};

const FlagGroup kMegatronParallel = {
    "Megatron-LM parallel and stack flags, one configuration (docs/cli.md §2, §4)",
    {
        Megatron("--tensor-model-parallel-size", "N"),
        Megatron("--pipeline-model-parallel-size", "N"),
        Megatron("--context-parallel-size", "N"),
        Megatron("--cp-comm-type", "p2p|a2a|a2a+p2p|all_gather"),
        Megatron("--hierarchical-context-parallel-sizes", "UP CP"),
        Megatron("--expert-model-parallel-size", "N"),
        Megatron("--virtual-pipeline-model-parallel-size", "N"),
        Megatron("--num-virtual-stages-per-pipeline-rank", "N"),
        Megatron("--expert-tensor-parallel-size", "N"),
        Megatron("--moe-token-dispatcher-type", "alltoall|flex"),
        Megatron("--moe-flex-dispatcher-backend", "deepep|hybridep|ncclep"),
        Megatron("--moe-enable-deepep", ""),
        Megatron("--num-layers-per-virtual-pipeline-stage", "N"),
        Megatron("--decoder-first-pipeline-num-layers", "N"),
        Megatron("--decoder-last-pipeline-num-layers", "N"),
        Megatron("--pipeline-model-parallel-layout", "LAYOUT"),
        Megatron("--account-for-embedding-in-pipeline-split", ""),
        Megatron("--account-for-loss-in-pipeline-split", ""),
        Megatron("--micro-batch-size", "N"),
        Megatron("--sequence-parallel", ""),
        Megatron("--use-distributed-optimizer", ""),
        Megatron("--recompute-activations", ""),
        Megatron("--recompute-granularity", "full|selective"),
        Megatron("--recompute-method", "uniform|block"),
        Megatron("--recompute-num-layers", "N"),
        Megatron("--recompute-modules", "MODULE ..."),
        Megatron("--overlap-grad-reduce", ""),
        Megatron("--overlap-param-gather", ""),
        Megatron("--grad-reduce-in-bf16", ""),
        Megatron("--accumulate-allreduce-grads-in-fp32", ""),
        Megatron("--fp8-param-gather", ""),
        Megatron("--ddp-bucket-size", "N"),
        Megatron("--use-flash-attn", ""),
        Megatron("--attention-backend", "flash|fused|unfused|local|auto"),
        Megatron("--tp-comm-overlap", ""),
        Megatron("--cross-entropy-loss-fusion", ""),
        Megatron("--attention-dropout", "R"),
        Megatron("--hidden-dropout", "R"),
    },
    /*compact=*/true};

const FlagGroup kSpace = {
    "space restrictions (docs/cli.md §3)",
    {
        Text("--tp", "LIST", "allowed tensor-parallel sizes, comma-separated (as --pp --dp ...)"),
        Text("--pp", "LIST", "pipeline stages"),
        Text("--dp", "LIST", "data-parallel sizes"),
        Text("--cp", "LIST", "context-parallel ring sizes"),
        Text("--up", "LIST", "Ulysses (a2a) sizes"),
        Text("--ep", "LIST", "expert-parallel sizes"),
        Text("--etp", "LIST", "expert tensor parallel sizes (MoE; default: the divisors of tp)"),
        Text("--vpp", "LIST", "virtual stages per pipeline rank"),
        Text("--mbs", "LIST", "micro-batch sizes"),
        Text("--recompute", "none,selective,full", "allowed recompute modes"),
        Text("--recompute-layers", "LIST", "fully recomputed layers per stage (0: all)"),
        Text("--fix", "KEY=VALUE,...", "pins dimensions; keys as in SPEC"),
        Switch("--tp-across-nodes", "allow tp groups beyond one NVLink domain (a node or a rack)"),
        Switch("--sweep-recompute-layers", "sweep 1..layers/pp-1 fully recomputed layers"),
        Int("--max-mbs", "N", "largest micro-batch enumerated (16)", 1, bounds::kMaxBatch),
    }};

const FlagGroup kStack = {
    "software stack (docs/cli.md §4)",
    {
        Switch("--no-flash-attention", "attention without flash attention"),
        Switch("--no-async-tp-backward",
               "every backward tensor-parallel collective exposed, as Megatron-LM before "
               "September 2021 (docs/models.md §4.3)"),
        Number("--attention-efficiency", "F",
               "the flash attention kernel's efficiency, of the dense peak, on long calls at head "
               "dim 128 (the GPU family's: docs/models.md §5)",
               1),
        Switch("--no-overlap-grad-reduce", "as --fix overlap_grad_reduce=off"),
        Switch("--no-overlap-param-gather", "as --fix overlap_param_gather=off"),
    }};

const FlagGroup kPlanFormat = {
    "output (docs/cli.md §5)",
    {
        Choice("--format", "table|json|csv|megatron|yaml|bridge",
               "table; csv: NeMo-style summary; megatron: Megatron-LM flags; yaml, bridge: "
               "Megatron-Bridge overrides (a YAML file, or key=value items)"),
    }};

const FlagGroup kTuneFormat = {
    "output (docs/cli.md §5)",
    {
        Choice("--format", "table|json|csv|megatron|yaml|bridge",
               "table; json: result.json; csv: trials.csv; megatron: best.args; yaml, bridge: the "
               "best measured configuration as Megatron-Bridge overrides"),
    }};

const FlagGroup kWorkerFormat = {"output", {Choice("--format", "table|json", "table")}};

// ---- each command's own flags ----

const FlagGroup kPlan = {"plan",
                         {
                             Int("--top", "K", "configurations to print (5)"),
                             Switch("--breakdown", "time and memory breakdown of each"),
                         }};

const FlagGroup kPredict = {
    "predict",
    {
        Text("--config", "SPEC",
             "e.g. tp=8,pp=4,cp=2,mbs=1,sp=on,recompute=selective,dist_opt=on (omitted keys take "
             "defaults; docs/cli.md §5); or the parallel flags of --megatron-args"),
    }};

const FlagGroup kTune = {
    "tune (docs/cli.md §6)",
    {
        Text("--study", "DIR", "the study directory (required; created if needed)"),
        Switch("--resume", "continue the study in DIR"),
        Switch("--salvage",
               "with --resume: a corrupt journal is copied aside and the study goes on from every "
               "valid record"),
        Unsigned("--seed", "N", "(0, or the study's on resume)"),
        Choice("--backend", "cpu|cuda|replay|megatron", "(replay with --replay-table, else cpu)"),
        Text("--replay-table", "FILE.csv",
             "measured trials to replay (only with --backend replay)"),
        Text("--train-command", "\"PROGRAM SCRIPT\"",
             "megatron: the training command each rank runs per trial, e.g. \"python "
             "/opt/Megatron-LM/pretrain_gpt.py\" (required with --backend megatron)"),
        Switch("--real-data", "megatron: keep the arguments' data flags instead of --mock-data"),
        // Checked by ReadP2PSemantics after what the backend allows (not with replay, megatron).
        Text("--p2p-semantics", "mpi|nccl",
             "the CPU backend's collectives as MPI or NCCL runs them"),
        // search::MakeSearcher names the searchers it knows.
        Text("--searcher", "thompson|random|grid|analytic", "(thompson)"),
        Number("--max-p-oom", "P",
               "never propose a configuration at least this likely to OOM (0.99)"),
        Duration("--budget", "S|90s|30m|8h", "wall-time budget (8h; 0: none)"),
        Int("--max-trials", "N", "(0: none)", 0),
        Duration("--trial-timeout", "S|30m", "per-trial deadline (600)"),
        Int("--warmup-iterations", "N", "(2)", 0),
        Int("--timed-iterations", "N", "(5)"),
        Number("--min-timed-seconds", "S",
               "time more iterations (up to 100) until they add up to S (0.5)"),
        // Each stop check draws this many posterior samples over every candidate: bounded work.
        Int("--stop-draws", "N", "stop rule (200)", 1, 1'000'000),
        Number("--stop-fraction", "F", "stop rule (0.99)"),
        Number("--stop-epsilon", "E", "stop rule (0.02)"),
        Number("--stop-delta", "D", "stop rule (0.002)"),
        Int("--min-measured", "N", "stop rule (5)"),
        Int("--top", "K", "rows of the final table (10)"),
        Switch("--quiet", "no progress lines"),
        Text("--status-addr", "ADDR", "status server address (127.0.0.1)"),
        Int("--status-port", "N", "status server port (8642; 0 any, -1 off; off for replay)", -1,
            65535),
    }};

const FlagGroup kWorker = {
    "trial runner (docs/cli.md §7)",
    {
        Choice("--backend", "cpu|cuda", "(cpu)"),
        Text("--p2p-semantics", "mpi|nccl", "(mpi on cpu, nccl on cuda)"),
        Number("--trial-timeout", "S", "(600)"),
        Int("--warmup", "N", "untimed iterations (1)", 0),
        Int("--iters", "N", "timed iterations (3)"),
        Number("--min-timed-seconds", "S", "(0)"),
        Int("--max-microbatches", "N|-1", "(0: the steady-state minimum; -1: all)", -1),
        Int("--seed", "N", "(1234)", 0, kInt64Max),
    }};

const FlagGroup kTrial = {"trial",
                          {Text("--config", "SPEC", "the configuration to time (required)")}};

const FlagGroup kProbe = {"probe", {Int("--repetitions", "N", "(5)")}};

const FlagGroup kReport = {"report (docs/cli.md §8)",
                           {
                               Text("--study", "DIR", "the study directory (required)"),
                               Text("--output", "DIR", "where the report files go (STUDY/report)"),
                               Int("--top", "K", "(5)"),
                               Choice("--format", "table|json|csv", "(table)"),
                               Switch("--plot", "PNGs into STUDY/plots, or --output's plots/"),
                           }};

const FlagGroup kReplayTable = {
    "make-replay-table (docs/cli.md §9)",
    {
        Text("--output", "FILE.csv", "(stdout)"),
        Choice("--world", "scaled|interactions|kernel|memory|noisy|near_memory|mixed", "(scaled)"),
        Int("--truth-seed", "N", "(1)", 0, kInt64Max),
        Text("--compute-range", "LO,HI", "(0.8,1.2)"),
        Text("--comm-range", "LO,HI", "(0.5,2.0)"),
        Text("--memory-scale-range", "LO,HI", "(0.95,1.1)"),
        Number("--noise", "S", "(0.03)"),
        Number("--memory-noise", "S", "(0.02)"),
        Number("--surprise-oom", "P", "(0.01)"),
    }};

const FlagGroup kEveryCommand = {
    "every command",
    {
        Switch("--help", "this command's usage (also -h, or autopar-tune help COMMAND)"),
        Switch("--version", "the version, and nothing else"),
    }};

std::vector<CommandHelp> MakeCommands() {
  std::vector<CommandHelp> c;
  c.push_back(
      {"tune",
       "(the default command) the online search, under mpirun",
       "Writes DIR/result.json, DIR/trials.csv and DIR/best.args; progress on stderr.\n",
       {&kTune, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack, &kTuneFormat}});
  c.push_back(
      {"plan",
       "rank the feasible space with the analytic model (no trials)",
       "Exit 3 when no configuration satisfies the constraints or none fits in memory.\n",
       {&kPlan, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack, &kPlanFormat}});
  c.push_back(
      {"predict",
       "the analytic model's estimate of one configuration, with its breakdown",
       "Exit 3 when the configuration does not fit in memory (the estimate is printed).\n",
       {&kPredict, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack, &kPlanFormat}});
  c.push_back(
      {"trial",
       "under mpirun: one timed trial of a configuration's real training step",
       "--nnodes x --nproc-per-node must equal the number of ranks. Exit 1 when the "
       "outcome is not ok.\n",
       {&kTrial, &kWorker, &kInputs, &kMegatronModel, &kMegatronParallel, &kStack, &kWorkerFormat},
       /*needs_trial_runner=*/true});
  c.push_back({"probe",
               "under mpirun: GEMM, attention and collective micro-benchmarks vs the model",
               "--tp LIST chooses the tensor-parallel sizes probed.\n",
               {&kProbe, &kWorker, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack,
                &kWorkerFormat},
               /*needs_trial_runner=*/true});
  c.push_back({"report",
               "summary and trial table of a finished, running or interrupted study",
               "Writes {trials.csv,summary.json,breakdown.csv} into --output, or DIR/report.\n",
               {&kReport}});
  c.push_back({"make-replay-table",
               "a synthetic replay table of the space",
               "",
               {&kReplayTable, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack}});
  c.push_back({"presets", "the model and GPU presets", "", {}});
  return c;
}

}  // namespace

const std::vector<CommandHelp>& AllCommands() {
  static const std::vector<CommandHelp> commands = MakeCommands();
  return commands;
}

const std::vector<CommandHelp>& Commands() {
  static const std::vector<CommandHelp> commands = [] {
    std::vector<CommandHelp> built;
    for (const CommandHelp& c : AllCommands()) {
#if !defined(AUTOPAR_WITH_TRIALS)
      if (c.needs_trial_runner) continue;
#endif
      built.push_back(c);
    }
    return built;
  }();
  return commands;
}

const CommandHelp* FindCommand(const std::string& name) {
  for (const CommandHelp& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

const FlagGroup& EveryCommandFlags() { return kEveryCommand; }

const FlagHelp* FindFlag(const CommandHelp& command, const std::string& flag) {
  for (const FlagGroup* g : command.groups) {
    for (const FlagHelp& f : g->flags) {
      if (flag == f.flag) return &f;
    }
  }
  return nullptr;
}

bool AnyCommandTakes(const std::string& flag) {
  for (const CommandHelp& c : AllCommands()) {
    if (FindFlag(c, flag) != nullptr) return true;
  }
  return false;
}

}  // namespace autopar::cli
