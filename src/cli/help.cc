#include "autopar/cli/help.h"

#include <cstdio>
#include <string>

#include "autopar/version.h"

namespace autopar::cli {
namespace {

// ---- the flag groups several commands share (docs/cli.md §2-§4) ----

const FlagGroup kInputs = {
    "model, job and cluster (docs/cli.md §2)",
    {
        {"--model", "NAME|FILE.yaml|config.json", "preset, YAML ModelSpec or Hugging Face config"},
        {"--megatron-args", "\"TEXT\"", "a pasted Megatron-LM argument list or script"},
        {"--megatron-args-file", "FILE", "the same, from a file"},
        {"--megatron-env", "NAME=V[,...]", "values of the pasted script's $NAMEs"},
        {"--global-batch-size", "N", "sequences per optimizer step (required)"},
        {"--seq-length", "N", "tokens per sequence (min(max_position_embeddings, 4096))"},
        {"--bf16", "", "bf16 training (the default)"},
        {"--fp16", "", "fp16 training"},
        {"--fp8-format", "e4m3|hybrid", "fp8 GEMMs"},
        {"--gpu", "NAME|FILE.yaml",
         "GPU preset or YAML (a100-80gb, with a note on stderr; required with --backend cuda)"},
        {"--cluster", "FILE.yaml", "nnodes, gpus_per_node and gpu"},
        {"--nnodes", "N", "nodes (1)"},
        {"--nproc-per-node", "N", "GPUs per node (8)"},
        {"--device-memory-gib", "X", "usable memory per GPU (the GPU's)"},
        {"--host-cores", "N", "cores the ranks of a --gpu cpu job share (only with --gpu cpu)"},
    }};

const FlagGroup kMegatronModel = {"Megatron-LM model flags, on top of --model (docs/cli.md §2)",
                                  {
                                      {"--num-layers", "N", ""},
                                      {"--hidden-size", "N", ""},
                                      {"--ffn-hidden-size", "N", ""},
                                      {"--num-attention-heads", "N", ""},
                                      {"--num-query-groups", "N", ""},
                                      {"--group-query-attention", "", ""},
                                      {"--kv-channels", "N", ""},
                                      {"--vocab-size", "N", ""},
                                      {"--tokenizer-type", "NAME", ""},
                                      {"--make-vocab-size-divisible-by", "N", ""},
                                      {"--max-position-embeddings", "N", ""},
                                      {"--swiglu", "", ""},
                                      {"--normalization", "NAME", ""},
                                      {"--position-embedding-type", "NAME", ""},
                                      {"--use-rotary-position-embeddings", "", ""},
                                      {"--untie-embeddings-and-output-weights", "", ""},
                                      {"--disable-bias-linear", "", ""},
                                      {"--multi-latent-attention", "", ""},
                                      {"--q-lora-rank", "N", ""},
                                      {"--kv-lora-rank", "N", ""},
                                      {"--qk-head-dim", "N", ""},
                                      {"--qk-pos-emb-head-dim", "N", ""},
                                      {"--v-head-dim", "N", ""},
                                      {"--num-experts", "N", ""},
                                      {"--moe-router-topk", "K", ""},
                                      {"--moe-ffn-hidden-size", "N", ""},
                                      {"--moe-shared-expert-intermediate-size", "N", ""},
                                      {"--moe-layer-freq", "PATTERN", ""},
                                      {"--window-size", "LEFT,0", ""},
                                      {"--window-attn-skip-freq", "N", ""},
                                      {"--mtp-num-layers", "N", ""},
                                  },
                                  /*compact=*/true};

const FlagGroup kMegatronParallel = {
    "Megatron-LM parallel and stack flags, one configuration (docs/cli.md §2, §4)",
    {
        {"--tensor-model-parallel-size", "N", ""},
        {"--pipeline-model-parallel-size", "N", ""},
        {"--context-parallel-size", "N", ""},
        {"--cp-comm-type", "p2p|a2a|a2a+p2p", ""},
        {"--hierarchical-context-parallel-sizes", "UP CP", ""},
        {"--expert-model-parallel-size", "N", ""},
        {"--virtual-pipeline-model-parallel-size", "N", ""},
        {"--num-virtual-stages-per-pipeline-rank", "N", ""},
        {"--expert-tensor-parallel-size", "N", ""},
        {"--moe-token-dispatcher-type", "alltoall", ""},
        {"--num-layers-per-virtual-pipeline-stage", "N", ""},
        {"--decoder-first-pipeline-num-layers", "N", ""},
        {"--decoder-last-pipeline-num-layers", "N", ""},
        {"--pipeline-model-parallel-layout", "LAYOUT", ""},
        {"--account-for-embedding-in-pipeline-split", "", ""},
        {"--account-for-loss-in-pipeline-split", "", ""},
        {"--micro-batch-size", "N", ""},
        {"--sequence-parallel", "", ""},
        {"--use-distributed-optimizer", "", ""},
        {"--recompute-activations", "", ""},
        {"--recompute-granularity", "full|selective", ""},
        {"--recompute-method", "uniform|block", ""},
        {"--recompute-num-layers", "N", ""},
        {"--overlap-grad-reduce", "", ""},
        {"--overlap-param-gather", "", ""},
        {"--grad-reduce-in-bf16", "", ""},
        {"--accumulate-allreduce-grads-in-fp32", "", ""},
        {"--ddp-bucket-size", "N", ""},
        {"--use-flash-attn", "", ""},
        {"--attention-backend", "flash|fused|unfused|local|auto", ""},
        {"--attention-dropout", "R", ""},
        {"--hidden-dropout", "R", ""},
    },
    /*compact=*/true};

const FlagGroup kSpace = {
    "space restrictions (docs/cli.md §3)",
    {
        {"--tp", "LIST", "allowed tensor-parallel sizes, comma-separated (as --pp --dp ...)"},
        {"--pp", "LIST", "pipeline stages"},
        {"--dp", "LIST", "data-parallel sizes"},
        {"--cp", "LIST", "context-parallel ring sizes"},
        {"--up", "LIST", "Ulysses (a2a) sizes"},
        {"--ep", "LIST", "expert-parallel sizes"},
        {"--etp", "LIST", "expert tensor parallel sizes (MoE; default: the divisors of tp)"},
        {"--vpp", "LIST", "virtual stages per pipeline rank"},
        {"--mbs", "LIST", "micro-batch sizes"},
        {"--recompute", "none,selective,full", "allowed recompute modes"},
        {"--recompute-layers", "LIST", "fully recomputed layers per stage (0: all)"},
        {"--fix", "KEY=VALUE,...", "pins dimensions; keys as in SPEC"},
        {"--tp-across-nodes", "", "allow tp groups beyond one NVLink domain (a node or a rack)"},
        {"--sweep-recompute-layers", "", "sweep 1..layers/pp-1 fully recomputed layers"},
        {"--max-mbs", "N", "largest micro-batch enumerated (16)"},
    }};

const FlagGroup kStack = {
    "software stack (docs/cli.md §4)",
    {
        {"--no-flash-attention", "", "attention without flash attention"},
        {"--no-overlap-grad-reduce", "", "as --fix overlap_grad_reduce=off"},
        {"--no-overlap-param-gather", "", "as --fix overlap_param_gather=off"},
    }};

const FlagGroup kPlanFormat = {
    "output (docs/cli.md §5)",
    {
        {"--format", "table|json|csv|megatron|yaml|bridge",
         "table; csv: NeMo-style summary; megatron: Megatron-LM flags; yaml, bridge: "
         "Megatron-Bridge overrides (a YAML file, or key=value items)"},
    }};

const FlagGroup kTuneFormat = {
    "output (docs/cli.md §5)",
    {
        {"--format", "table|json|csv|megatron|yaml|bridge",
         "table; json: result.json; csv: trials.csv; megatron: best.args; yaml, bridge: the best "
         "measured configuration as Megatron-Bridge overrides"},
    }};

const FlagGroup kWorkerFormat = {"output", {{"--format", "table|json", "table"}}};

// ---- each command's own flags ----

const FlagGroup kPlan = {"plan",
                         {
                             {"--top", "K", "configurations to print (5)"},
                             {"--breakdown", "", "time and memory breakdown of each"},
                         }};

const FlagGroup kPredict = {
    "predict",
    {
        {"--config", "SPEC",
         "e.g. tp=8,pp=4,cp=2,mbs=1,sp=on,recompute=selective,dist_opt=on (omitted keys take "
         "defaults; docs/cli.md §5); or the parallel flags of --megatron-args"},
    }};

const FlagGroup kTune = {
    "tune (docs/cli.md §6)",
    {
        {"--study", "DIR", "the study directory (required; created if needed)"},
        {"--resume", "", "continue the study in DIR"},
        {"--salvage", "",
         "with --resume: a corrupt journal is copied aside and the study goes on from every "
         "valid record"},
        {"--seed", "N", "(0, or the study's on resume)"},
        {"--backend", "cpu|cuda|replay|megatron", "(replay with --replay-table, else cpu)"},
        {"--replay-table", "FILE.csv", "measured trials to replay (only with --backend replay)"},
        {"--train-command", "\"PROGRAM SCRIPT\"",
         "megatron: the training command each rank runs per trial, e.g. \"python "
         "/opt/Megatron-LM/pretrain_gpt.py\" (required with --backend megatron)"},
        {"--real-data", "", "megatron: keep the arguments' data flags instead of --mock-data"},
        {"--p2p-semantics", "mpi|nccl", "the CPU backend's collectives as MPI or NCCL runs them"},
        {"--searcher", "thompson|random|grid|analytic", "(thompson)"},
        {"--max-p-oom", "P", "never propose a configuration at least this likely to OOM (0.9)"},
        {"--budget", "S|90s|30m|8h", "wall-time budget (8h; 0: none)"},
        {"--max-trials", "N", "(0: none)"},
        {"--trial-timeout", "S|30m", "per-trial deadline (600)"},
        {"--warmup-iterations", "N", "(2)"},
        {"--timed-iterations", "N", "(5)"},
        {"--min-timed-seconds", "S",
         "time more iterations (up to 100) until they add up to S (0.5)"},
        {"--stop-draws", "N", "stop rule (200)"},
        {"--stop-fraction", "F", "stop rule (0.95)"},
        {"--stop-epsilon", "E", "stop rule (0.02)"},
        {"--stop-delta", "D", "stop rule (0.01)"},
        {"--min-measured", "N", "stop rule (5)"},
        {"--top", "K", "rows of the final table (10)"},
        {"--quiet", "", "no progress lines"},
        {"--status-addr", "ADDR", "status server address (127.0.0.1)"},
        {"--status-port", "N", "status server port (8642; 0 any, -1 off; off for replay)"},
    }};

const FlagGroup kWorker = {
    "trial runner (docs/cli.md §7)",
    {
        {"--backend", "cpu|cuda", "(cpu)"},
        {"--p2p-semantics", "mpi|nccl", "(mpi on cpu, nccl on cuda)"},
        {"--trial-timeout", "S", "(600)"},
        {"--warmup", "N", "untimed iterations (1)"},
        {"--iters", "N", "timed iterations (3)"},
        {"--min-timed-seconds", "S", "(0)"},
        {"--max-microbatches", "N|-1", "(0: the steady-state minimum; -1: all)"},
        {"--seed", "N", "(1234)"},
    }};

const FlagGroup kTrial = {"trial", {{"--config", "SPEC", "the configuration to time (required)"}}};

const FlagGroup kProbe = {"probe", {{"--repetitions", "N", "(5)"}}};

const FlagGroup kReport = {"report (docs/cli.md §8)",
                           {
                               {"--study", "DIR", "the study directory (required)"},
                               {"--output", "DIR", "where the report files go (STUDY/report)"},
                               {"--top", "K", "(5)"},
                               {"--format", "table|json|csv", "(table)"},
                               {"--plot", "", "PNGs into STUDY/plots, or --output's plots/"},
                           }};

const FlagGroup kReplayTable = {
    "make-replay-table (docs/cli.md §9)",
    {
        {"--output", "FILE.csv", "(stdout)"},
        {"--world", "scaled|interactions|kernel|memory|noisy|near_memory|mixed", "(scaled)"},
        {"--truth-seed", "N", "(1)"},
        {"--compute-range", "LO,HI", "(0.8,1.2)"},
        {"--comm-range", "LO,HI", "(0.5,2.0)"},
        {"--memory-scale-range", "LO,HI", "(0.95,1.1)"},
        {"--noise", "S", "(0.03)"},
        {"--memory-noise", "S", "(0.02)"},
        {"--surprise-oom", "P", "(0.01)"},
    }};

const FlagGroup kHelp = {
    "every command",
    {
        {"--help", "", "this command's usage (also -h, or autopar-tune help COMMAND)"},
        {"--version", "", "the version, and nothing else"},
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
#if defined(AUTOPAR_WITH_TRIALS)
  c.push_back({"trial",
               "under mpirun: one timed trial of a configuration's real training step",
               "--nnodes x --nproc-per-node must equal the number of ranks. Exit 1 when the "
               "outcome is not ok.\n",
               {&kTrial, &kWorker, &kInputs, &kMegatronModel, &kMegatronParallel, &kStack,
                &kWorkerFormat}});
  c.push_back({"probe",
               "under mpirun: GEMM, attention and collective micro-benchmarks vs the model",
               "--tp LIST chooses the tensor-parallel sizes probed.\n",
               {&kProbe, &kWorker, &kInputs, &kMegatronModel, &kMegatronParallel, &kSpace, &kStack,
                &kWorkerFormat}});
#endif
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

constexpr size_t kWidth = 100;       // docs/style.md §1's columns
const std::string kIndent(33, ' ');  // where a flag's meaning starts

// `text` in lines of at most kWidth columns after kIndent, the later lines indented by it.
std::string Wrap(const std::string& text) {
  std::string wrapped, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && kIndent.size() + line.size() + 1 + word.size() > kWidth) {
      wrapped += line + "\n" + kIndent;
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  return wrapped + line;
}

void WriteGroup(std::ostream& out, const FlagGroup& g) {
  out << "\n" << g.title << ":\n";
  if (g.compact) {
    std::string line = " ";
    for (const FlagHelp& f : g.flags) {
      std::string item = std::string(" ") + f.flag + (*f.value ? std::string(" ") + f.value : "");
      if (line.size() + item.size() > kWidth) {
        out << line << "\n";
        line = " ";
      }
      line += item;
    }
    out << line << "\n";
    return;
  }
  for (const FlagHelp& f : g.flags) {
    const std::string left = std::string(f.flag) + (*f.value ? std::string(" ") + f.value : "");
    char head[64];
    std::snprintf(head, sizeof head, "  %-30s ", left.c_str());
    out << (left.size() <= 30 ? std::string(head) : "  " + left + "\n" + kIndent);
    out << Wrap(f.meaning) << "\n";
  }
}

}  // namespace

const std::vector<CommandHelp>& Commands() {
  static const std::vector<CommandHelp> commands = MakeCommands();
  return commands;
}

const CommandHelp* FindCommand(const std::string& name) {
  for (const CommandHelp& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void WriteUsage(std::ostream& out) {
  out << "usage: autopar-tune [COMMAND] [FLAGS]   (flags alone run tune)\n"
         "       autopar-tune COMMAND --help | help COMMAND | --version\n\ncommands:\n";
  for (const CommandHelp& c : Commands()) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-19s %s\n", c.name, c.summary);
    out << line;
  }
  out << "\nautopar-tune COMMAND --help lists the command's flags; docs/cli.md has them all.\n"
         "exit codes: 0 ok, 1 environment or trial failure, 2 bad input (the message names the\n"
         "flag), 3 no feasible configuration (predict: it does not fit), 4 study locked or\n"
         "mismatched\n";
}

void WriteCommandHelp(std::ostream& out, const CommandHelp& command) {
  out << "usage: autopar-tune " << command.name << (command.groups.empty() ? "" : " [FLAGS]")
      << "\n"
      << command.summary << "\n"
      << command.details;
  for (const FlagGroup* g : command.groups) WriteGroup(out, *g);
  WriteGroup(out, kHelp);
}

const char* Version() { return AUTOPAR_VERSION_STRING; }

}  // namespace autopar::cli
