// Every Megatron-LM flag the tool emits (MegatronFlags: `--format megatron`, best.args,
// megatron_args), with what it means to Megatron-LM (NVIDIA/Megatron-LM d98e8a6,
// megatron/training/arguments.py and the dataclasses its ArgumentGroupFactory turns into flags).
// The cases cover every value of every knob of the space; each must print exactly its flag line,
// use only flags of the table, and read back (`--megatron-args`) as the same configuration. A new
// flag fails the test until the table says what it means; scripts/check_megatron_flags.sh checks
// the same flags against a Megatron-LM checkout.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/cli/plan_format.h"
#include "autopar/space/space.h"
#include "autopar/spec/parse.h"

namespace autopar::cli {
namespace {

struct FlagMeaning {
  const char* flag;
  const char* knob;      // what of ours it carries
  const char* megatron;  // what Megatron-LM does with it
};

// clang-format off
constexpr FlagMeaning kEmitted[] = {
    {"--tensor-model-parallel-size", "tp",
     "ModelParallelConfig.tensor_model_parallel_size: tensor parallel group size"},
    {"--pipeline-model-parallel-size", "pp",
     "ModelParallelConfig.pipeline_model_parallel_size: pipeline stages"},
    {"--decoder-first-pipeline-num-layers", "pp_first (uneven stages)",
     "TransformerConfig.num_layers_in_first_pipeline_stage: the first stage's transformer layers; "
     "the stages not given share the rest evenly"},
    {"--decoder-last-pipeline-num-layers", "pp_last (uneven stages)",
     "TransformerConfig.num_layers_in_last_pipeline_stage: the last stage's transformer layers"},
    {"--account-for-embedding-in-pipeline-split", "split_embedding=on (virtual stages)",
     "TransformerConfig.account_for_embedding_in_pipeline_split: the embedding counts as a layer "
     "of the even split, the first model chunk holds one transformer layer fewer"},
    {"--account-for-loss-in-pipeline-split", "split_loss=on (virtual stages)",
     "TransformerConfig.account_for_loss_in_pipeline_split: the loss counts as a layer of the "
     "even split, the last model chunk holds one transformer layer fewer"},
    {"--num-virtual-stages-per-pipeline-rank", "vpp > 1",
     "virtual_pipeline_model_parallel_size: model chunks per pipeline rank (interleaved 1F1B), "
     "with even or uneven stages (--num-layers-per-virtual-pipeline-stage is refused with uneven "
     "ones)"},
    {"--context-parallel-size", "cp·up > 1",
     "ModelParallelConfig.context_parallel_size: the sequence split over cp·up ranks; dp is what "
     "the world leaves over tp·pp·cp"},
    {"--cp-comm-type",
     "up > 1: a2a (Ulysses alone) or a2a+p2p (Ulysses inside rings); cp_comm=allgather: "
     "all_gather",
     "how attention crosses the cp group: p2p ring (default), a2a all-to-all over heads, a2a+p2p "
     "hierarchical, all_gather K and V gathered (Transformer Engine's spelling, passed through)"},
    {"--hierarchical-context-parallel-sizes", "up and cp, with a2a+p2p",
     "ModelParallelConfig.hierarchical_context_parallel_sizes: the a2a group's size, then the "
     "p2p group's; their product is the cp size"},
    {"--expert-model-parallel-size", "ep > 1",
     "ModelParallelConfig.expert_model_parallel_size: experts split over ep ranks"},
    {"--expert-tensor-parallel-size", "etp, for every MoE model (even at its default, tp)",
     "ModelParallelConfig.expert_tensor_parallel_size: each expert's weights split over etp "
     "ranks; the expert grid etp·ep·edp·pp folds over the world (parallel_state.py)"},
    {"--moe-token-dispatcher-type",
     "ep > 1 or dispatcher=flex: alltoall or flex, the dispatch the cost model times",
     "TransformerConfig.moe_token_dispatcher_type (default allgather; flex: DeepEP, HybridEP or "
     "NCCL-EP over the etp·ep ranks, which must be more than one)"},
    {"--micro-batch-size", "mbs", "TrainingConfig.micro_batch_size"},
    {"--global-batch-size", "the job's batch (dp implied)",
     "TrainingConfig.global_batch_size; micro-batches = gbs / (dp·mbs)"},
    {"--sequence-parallel", "sp=on", "ModelParallelConfig.sequence_parallel"},
    {"--recompute-granularity", "recompute=selective|full",
     "TransformerConfig.recompute_granularity"},
    {"--recompute-modules", "recompute=selective: recompute_modules (core_attn by default)",
     "TransformerConfig.recompute_modules"},
    {"--recompute-method", "recompute=full: uniform (every layer) or block (recompute_layers)",
     "TransformerConfig.recompute_method"},
    {"--recompute-num-layers", "recompute=full: 1 per uniform unit, or recompute_layers per stage",
     "TransformerConfig.recompute_num_layers"},
    {"--use-distributed-optimizer", "dist_opt=on",
     "optimizer state sharded over the dp·cp group"},
    {"--overlap-grad-reduce", "overlap_grad_reduce=on",
     "DistributedDataParallelConfig.overlap_grad_reduce (default off)"},
    {"--overlap-param-gather", "overlap_param_gather=on",
     "DistributedDataParallelConfig.overlap_param_gather; needs the two above"},
    {"--grad-reduce-in-bf16", "grad_reduce_dtype=bf16 with bf16 or fp8 parameters",
     "reduce gradients in bf16 (default fp32 for bf16 runs)"},
    {"--accumulate-allreduce-grads-in-fp32", "grad_reduce_dtype=fp32 with fp16 parameters",
     "reduce gradients in fp32 (default fp16 for fp16 runs)"},
    {"--fp8-param-gather", "fp8_param_gather=on (FP8 training, dist_opt=on)",
     "DistributedDataParallelConfig.fp8_param_gather and TransformerConfig.fp8_param: the linear "
     "weights kept in FP8 alone and all-gathered in FP8"},
};
// clang-format on

const FlagMeaning* Meaning(const std::string& flag) {
  for (const FlagMeaning& m : kEmitted) {
    if (flag == m.flag) return &m;
  }
  return nullptr;
}

std::vector<std::string> Flags(const std::string& line) {
  std::istringstream words(line);
  std::vector<std::string> flags;
  for (std::string w; words >> w;) {
    if (w.rfind("--", 0) == 0) flags.push_back(w);
  }
  return flags;
}

// tiny-moe (4 layers, 4 query and 2 kv heads, 4 experts) on 16 ranks, 64 × 64 tokens; uneven
// stages on llama3-8b (32 layers).
constexpr int64_t kWorld = 16;

struct Case {
  const char* spec;
  Precision precision;
  const char* flags;
  const char* model = "tiny-moe";
};

// clang-format off
const Case kCases[] = {
    {"tp=1,pp=1", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
    {"tp=2,pp=2,vpp=2,mbs=2,sp=on", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
     "--num-virtual-stages-per-pipeline-rank 2 --expert-tensor-parallel-size 2 "
     "--micro-batch-size 2 --global-batch-size 64 --sequence-parallel --overlap-grad-reduce"},
    {"tp=2,pp=4,pp_first=2,pp_last=6,vpp=2", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
     "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 "
     "--num-virtual-stages-per-pipeline-rank 2 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce",
     "llama3-8b"},
    // 15 and 17 layers: 16 recomputed layers are fewer than the larger stage's.
    {"tp=2,pp=2,pp_first=15,recompute=full,recompute_layers=16", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
     "--decoder-first-pipeline-num-layers 15 --micro-batch-size 1 --global-batch-size 64 "
     "--recompute-granularity full --recompute-method block --recompute-num-layers 16 "
     "--overlap-grad-reduce",
     "llama3-8b"},
    // Llama-2-13B's 40 layers with the embedding and the loss counted: 42 over 2 × 3 model chunks
    // of 7, the first and the last of 6.
    {"tp=4,pp=2,vpp=3,sp=on,split_embedding=on,split_loss=on", Precision::kBF16,
     "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--num-virtual-stages-per-pipeline-rank 3 --micro-batch-size 1 --global-batch-size 64 "
     "--sequence-parallel --overlap-grad-reduce",
     "llama2-13b"},
    {"tp=2,pp=4,pp_last=5", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
     "--decoder-last-pipeline-num-layers 5 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce",
     "llama3-8b"},
    {"cp=2", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 2 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
    {"cp=2,cp_comm=allgather", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 2 "
     "--cp-comm-type all_gather --expert-tensor-parallel-size 1 --micro-batch-size 1 "
     "--global-batch-size 64 --overlap-grad-reduce"},
    {"up=2", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 2 "
     "--cp-comm-type a2a --expert-tensor-parallel-size 1 --micro-batch-size 1 "
     "--global-batch-size 64 --overlap-grad-reduce"},
    {"cp=4,up=2", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 8 "
     "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
    {"tp=2,ep=4,sp=on", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
     "--expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall "
     "--expert-tensor-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 "
     "--sequence-parallel --overlap-grad-reduce"},
    {"tp=2,ep=4,etp=1,sp=on", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
     "--expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--sequence-parallel --overlap-grad-reduce"},
    {"tp=2,ep=4,etp=1,sp=on,dispatcher=flex", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
     "--expert-model-parallel-size 4 --moe-token-dispatcher-type flex "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--sequence-parallel --overlap-grad-reduce"},
    {"tp=2,sp=on,dispatcher=flex", Precision::kBF16,
     "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
     "--moe-token-dispatcher-type flex --expert-tensor-parallel-size 2 --micro-batch-size 1 "
     "--global-batch-size 64 --sequence-parallel --overlap-grad-reduce"},
    {"ep=2,etp=2", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall "
     "--expert-tensor-parallel-size 2 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
    {"recompute=selective", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--recompute-granularity selective --recompute-modules core_attn --overlap-grad-reduce"},
    {"recompute=selective,recompute_modules=layernorm+moe", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--recompute-granularity selective --recompute-modules layernorm moe "
     "--overlap-grad-reduce"},
    {"recompute=full", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
     "--overlap-grad-reduce"},
    {"pp=2,recompute=full,recompute_layers=1", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--recompute-granularity full --recompute-method block --recompute-num-layers 1 "
     "--overlap-grad-reduce"},
    {"dist_opt=on", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"},
    {"dist_opt=on,overlap_param_gather=off", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--use-distributed-optimizer --overlap-grad-reduce"},
    {"dist_opt=on,overlap_grad_reduce=off", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--use-distributed-optimizer"},
    {"grad_reduce_dtype=bf16", Precision::kBF16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce --grad-reduce-in-bf16"},
    {"grad_reduce_dtype=bf16", Precision::kFP8,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce --grad-reduce-in-bf16"},
    {"tp=1", Precision::kFP8,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
    {"dist_opt=on,fp8_param_gather=on", Precision::kFP8,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
     "--fp8-param-gather"},
    {"tp=1", Precision::kFP16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce --accumulate-allreduce-grads-in-fp32"},
    {"grad_reduce_dtype=bf16", Precision::kFP16,
     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
     "--expert-tensor-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 "
     "--overlap-grad-reduce"},
};
// clang-format on

TrainSpec Train(Precision precision) {
  TrainSpec t;
  t.global_batch_size = 64;
  t.seq_length = 64;
  t.precision = precision;
  return t;
}

const char* PrecisionFlag(Precision p) {
  switch (p) {
    case Precision::kFP16:
      return "--fp16";
    case Precision::kFP8:
      return "--fp8-format=hybrid";
    default:
      return "--bf16";
  }
}

TEST(MegatronFlags, EveryCaseIsAValidConfigurationOfTheSpace) {
  ClusterSpec cluster;
  cluster.nnodes = 2;
  cluster.gpus_per_node = 8;
  cluster.gpu = GpuPreset("h100");
  for (const Case& k : kCases) {
    const SearchSpace space(ModelPreset(k.model), Train(k.precision), cluster, {});
    EXPECT_EQ(space.Check(Complete(ParseSpec(k.spec), kWorld)), "") << k.spec;
  }
}

TEST(MegatronFlags, EachKnobValuePrintsExactlyItsFlags) {
  for (const Case& k : kCases) {
    const ParallelConfig c = Complete(ParseSpec(k.spec), kWorld);
    EXPECT_EQ(MegatronFlags(c, ModelPreset(k.model), Train(k.precision)), k.flags)
        << k.spec << " " << PrecisionFlag(k.precision);
  }
}

TEST(MegatronFlags, EveryEmittedFlagHasATableEntryAndEveryEntryIsEmitted) {
  std::set<std::string> emitted;
  for (const Case& k : kCases) {
    const std::string line = MegatronFlags(Complete(ParseSpec(k.spec), kWorld),
                                           ModelPreset(k.model), Train(k.precision));
    std::set<std::string> once;
    for (const std::string& flag : Flags(line)) {
      EXPECT_NE(Meaning(flag), nullptr)
          << flag << " (in " << k.spec << ") has no entry in kEmitted: say what it means";
      EXPECT_TRUE(once.insert(flag).second) << flag << " twice in " << line;
      emitted.insert(flag);
    }
  }
  for (const FlagMeaning& m : kEmitted) {
    EXPECT_EQ(emitted.count(m.flag), 1u) << m.flag << " is in the table but no case emits it";
  }
}

// The whole planner's output stays inside the table too, on setups with every kind of layout.
TEST(MegatronFlags, PlannedLinesUseOnlyTableFlags) {
  const std::vector<std::vector<std::string>> setups = {
      {"--model", "llama3-8b", "--seq-length", "131072", "--global-batch-size", "64", "--gpu",
       "h100", "--nnodes", "2", "--nproc-per-node", "8", "--fix", "up=2"},
      {"--model", "mixtral-8x7b", "--global-batch-size", "256", "--gpu", "h100", "--nnodes", "32",
       "--nproc-per-node", "8"},
      {"--model", "llama3-70b", "--global-batch-size", "128", "--gpu", "h100", "--nnodes", "8",
       "--nproc-per-node", "8", "--seq-length", "32768", "--fp16"},
  };
  for (std::vector<std::string> argv : setups) {
    argv.insert(argv.begin(), "plan");
    for (const char* extra : {"--top", "200", "--format", "megatron"}) argv.push_back(extra);
    std::ostringstream out, err;
    ASSERT_EQ(Main(argv, out, err), 0) << err.str();
    std::istringstream lines(out.str());
    int n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
      for (const std::string& flag : Flags(line)) {
        EXPECT_NE(Meaning(flag), nullptr) << flag << " in " << line;
      }
    }
    EXPECT_GT(n, 10) << argv[2];
  }
}

// Pasted back (`--megatron-args`), each line describes the configuration it came from.
TEST(MegatronFlags, EveryCaseReadsBackAsItsConfiguration) {
  for (const Case& k : kCases) {
    auto predict = [&](const std::string& flag, const std::string& value) {
      std::ostringstream out, err;
      const int code = Main({"predict", "--model", k.model, "--gpu", "h100", "--nnodes", "2",
                             "--nproc-per-node", "8", "--global-batch-size", "64", "--seq-length",
                             "64", PrecisionFlag(k.precision), flag, value, "--format", "csv"},
                            out, err);
      EXPECT_EQ(code, 0) << flag << " " << value << ": " << err.str();
      return out.str();
    };
    EXPECT_EQ(predict("--megatron-args", k.flags), predict("--config", k.spec))
        << k.spec << " " << PrecisionFlag(k.precision);
  }
}

// The expert tensor parallel size is the configuration's, pasted or on our command line; a dense
// model has no experts for it to split and says so.
TEST(MegatronFlags, ExpertTensorParallelSizeIsReadBack) {
  auto run = [](const std::string& model, const std::string& flags, std::string* err_text) {
    std::ostringstream out, err;
    const int code = Main({"predict", "--model", model, "--gpu", "h100", "--nnodes", "2",
                           "--nproc-per-node", "8", "--global-batch-size", "64", "--seq-length",
                           "64", "--megatron-args", flags, "--format", "csv"},
                          out, err);
    EXPECT_EQ(code, 0) << flags << ": " << err.str();
    if (err_text) *err_text = err.str();
    return out.str();
  };
  EXPECT_NE(run("tiny-moe",
                "--tensor-model-parallel-size 2 --sequence-parallel "
                "--expert-model-parallel-size 4 --expert-tensor-parallel-size 1",
                nullptr)
                .find("\"tp=2,pp=1,dp=8,cp=1,up=1,ep=4,etp=1,"),
            std::string::npos);
  // Megatron's default, tp, spelled out or not: one configuration.
  EXPECT_EQ(run("tiny-moe", "--tensor-model-parallel-size 2 --sequence-parallel "
                            "--expert-tensor-parallel-size 2", nullptr),
            run("tiny-moe", "--tensor-model-parallel-size 2 --sequence-parallel", nullptr));
  std::string notes;
  const std::string dense =
      run("tiny", "--tensor-model-parallel-size 2 --expert-tensor-parallel-size 1", &notes);
  EXPECT_NE(notes.find("--expert-tensor-parallel-size 1: ignored"), std::string::npos) << notes;
  EXPECT_EQ(dense.find("etp="), std::string::npos) << dense;
}

TEST(MegatronFlags, ContextParallelFlagsThatDoNotDescribeOurSplitsAreRefused) {
  auto refusal = [](const std::string& flags) {
    std::ostringstream out, err;
    const int code = Main(
        {"predict", "--model", "tiny-moe", "--gpu", "h100", "--nnodes", "2", "--nproc-per-node",
         "8", "--global-batch-size", "64", "--seq-length", "64", "--megatron-args", flags},
        out, err);
    EXPECT_EQ(code, 2) << flags;
    return err.str();
  };
  // Megatron asserts the sizes with a2a+p2p, and that they multiply to the cp size.
  EXPECT_NE(refusal("--context-parallel-size 4 --cp-comm-type a2a+p2p")
                .find("--hierarchical-context-parallel-sizes"),
            std::string::npos);
  EXPECT_NE(refusal("--context-parallel-size 8 --cp-comm-type a2a+p2p "
                    "--hierarchical-context-parallel-sizes 2 2")
                .find("multiply to 4"),
            std::string::npos);
  // Megatron's help spells it allgather; Transformer Engine, which gets the value as given,
  // takes all_gather only.
  const std::string allgather = refusal("--context-parallel-size 2 --cp-comm-type allgather");
  EXPECT_NE(allgather.find("--cp-comm-type"), std::string::npos) << allgather;
  EXPECT_NE(allgather.find("all_gather"), std::string::npos) << allgather;
  EXPECT_NE(refusal("--context-parallel-size 2 --cp-comm-type p2p a2a").find("one type"),
            std::string::npos);
  // tiny-moe has 2 kv heads: a2a over 4 ranks would have to replicate them.
  EXPECT_NE(refusal("--context-parallel-size 4 --cp-comm-type a2a").find("key/value heads"),
            std::string::npos);
  // The same type for every layer, or `=`, reads as one type.
  std::ostringstream out, err;
  EXPECT_EQ(
      Main({"predict", "--model", "tiny-moe", "--gpu", "h100", "--nnodes", "2", "--nproc-per-node",
            "8", "--global-batch-size", "64", "--seq-length", "64", "--megatron-args",
            "--context-parallel-size 2 --cp-comm-type a2a a2a a2a a2a --bf16", "--format", "csv"},
           out, err),
      0)
      << err.str();
  EXPECT_NE(out.str().find("\"tp=1,pp=1,dp=8,cp=1,up=2,"), std::string::npos) << out.str();
}

// --fp8-param-gather: read with the distributed optimizer in FP8 training, refused where Megatron
// refuses it (naming the flag and what it needs), left out with a note under FSDP (not modelled).
TEST(MegatronFlags, Fp8ParamGatherIsReadWhereMegatronTakesIt) {
  auto predict = [](const std::string& flags, std::string* err_text) {
    std::ostringstream out, err;
    const int code = Main(
        {"predict", "--model", "llama2-7b", "--gpu", "h100", "--nnodes", "1", "--nproc-per-node",
         "8", "--global-batch-size", "64", "--megatron-args", flags, "--format", "csv"},
        out, err);
    *err_text = err.str();
    return code == 0 ? out.str() : std::to_string(code);
  };
  std::string err;
  const std::string fp8 = "--tensor-model-parallel-size 2 --fp8-format hybrid ";
  const std::string on = predict(fp8 + "--use-distributed-optimizer --fp8-param-gather", &err);
  EXPECT_NE(on.find("fp8_param_gather=on"), std::string::npos) << on << err;
  EXPECT_EQ(err.find("ignored (not modelled)"), std::string::npos) << err;
  EXPECT_EQ(predict(fp8 + "--fp8-param-gather", &err), "2");
  EXPECT_NE(err.find("--fp8-param-gather: needs --use-distributed-optimizer"), std::string::npos)
      << err;
  EXPECT_EQ(predict("--tensor-model-parallel-size 2 --bf16 --use-distributed-optimizer "
                    "--fp8-param-gather",
                    &err),
            "2");
  EXPECT_NE(err.find("--fp8-param-gather: needs FP8 training"), std::string::npos) << err;
  // --fix wins over the command line's configuration, in plan as in predict.
  std::ostringstream out, plan_err;
  ASSERT_EQ(Main({"plan",      "--model",
                  "llama2-7b", "--gpu",
                  "h100",      "--nnodes",
                  "1",         "--nproc-per-node",
                  "8",         "--global-batch-size",
                  "64",        "--fp8-format",
                  "hybrid",    "--tensor-model-parallel-size",
                  "2",         "--use-distributed-optimizer",
                  "--fix",     "fp8_param_gather=on",
                  "--top",     "1",
                  "--format",  "csv"},
                 out, plan_err),
            0)
      << plan_err.str();
  EXPECT_NE(out.str().find(",fp8_param_gather=on\""), std::string::npos) << out.str();
  const std::string fsdp = predict(fp8 + "--use-megatron-fsdp --fp8-param-gather", &err);
  EXPECT_EQ(fsdp.find("fp8_param_gather=on"), std::string::npos) << fsdp;
  EXPECT_NE(err.find("--fp8-param-gather with FSDP: not modelled"), std::string::npos) << err;
}

}  // namespace
}  // namespace autopar::cli
