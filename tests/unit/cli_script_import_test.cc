// Megatron-LM launch scripts as users paste them (issue 11): NVIDIA's examples import as shipped,
// with Megatron's defaults where they are silent, its own corrections made with a note, and the
// flags the model does not read named in one line.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/common/errors.h"
#include "cli_test_util.h"

namespace autopar::cli {
namespace {

std::string Script(const std::string& name) {
  return std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/nvidia-" + name + ".sh";
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CliScriptImport, Gpt3ExampleNeedsNoVocabSize) {
  // The vocabulary comes from the GPT-2 BPE files the script names, padded as Megatron pads it.
  const Result r = RunCli({"predict", "--megatron-args-file", Script("gpt3-175b"), "--gpu",
                           "a100-80gb", "--nnodes", "16", "--format", "csv"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(Has(r.err, "note: --vocab-size not given: 50257 tokens, GPT-2's BPE")) << r.err;
  EXPECT_TRUE(Has(r.err, "padded to 51200")) << r.err;
  // tp=8, pp=16 over 16 x 8 GPUs (the script's torchrun gives 8 per node), mbs 1, fp16.
  EXPECT_TRUE(Has(r.out, "\"tp=8,pp=16,dp=1,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,recompute=none,"))
      << r.out;
  // Nothing of this script changes the step without being modelled.
  EXPECT_FALSE(Has(r.err, "ignored")) << r.err;
  // The same model as the preset (an fp16 run reduces its gradients in fp16 unless told).
  const Result preset = RunCli({"predict",
                                "--model",
                                "gpt3-175b",
                                "--gpu",
                                "a100-80gb",
                                "--nnodes",
                                "16",
                                "--nproc-per-node",
                                "8",
                                "--global-batch-size",
                                "1536",
                                "--seq-length",
                                "2048",
                                "--fp16",
                                "--attention-dropout",
                                "0.1",
                                "--hidden-dropout",
                                "0.1",
                                "--config",
                                "tp=8,pp=16,mbs=1,overlap_grad_reduce=off,grad_reduce_dtype=bf16",
                                "--format",
                                "csv"});
  ASSERT_EQ(preset.code, kExitOk) << preset.err;
  const auto without_name = [](std::string csv) {
    for (const char* name : {"1,megatron,", "1,gpt3-175b,"}) {
      if (const size_t at = csv.find(name); at != std::string::npos) csv.erase(at, strlen(name));
    }
    return csv;
  };
  EXPECT_EQ(without_name(r.out), without_name(preset.out));
}

TEST(CliScriptImport, MixtralExampleTurnsSequenceParallelOffAtTp1) {
  const Result r = RunCli({"predict", "--megatron-args-file", Script("mixtral-8x7b"), "--gpu",
                           "h100", "--nnodes", "4", "--format", "csv"});
  ASSERT_EQ(r.code == kExitOk || r.code == kExitInfeasible, true) << r.err;
  EXPECT_TRUE(Has(r.err, "note: --sequence-parallel: off at --tensor-model-parallel-size 1"))
      << r.err;
  EXPECT_TRUE(Has(r.err, "32000 tokens, Llama 2's SentencePiece model")) << r.err;
  // tp=1, pp=4, ep=8, dist_opt: over 4 x 8 GPUs, dp = 8.
  EXPECT_TRUE(Has(r.out, "\"tp=1,pp=4,dp=8,cp=1,up=1,ep=8,vpp=1,mbs=1,sp=off,")) << r.out;
  EXPECT_FALSE(Has(r.err, "ignored")) << r.err;
}

TEST(CliScriptImport, Llama3Fp8ExampleExpandsItsVariablesAndArrays) {
  const Result r = RunCli({"predict", "--megatron-args-file", Script("llama3-8b-fp8"), "--gpu",
                           "h100", "--format", "csv"});
  ASSERT_TRUE(r.code == kExitOk || r.code == kExitInfeasible) << r.err;
  // $NUM_LAYERS and friends from the script's own assignments; "--fp8-format hybrid" as two
  // words: an FP8 run of 32 layers at 8192 tokens.
  const Result plan = RunCli(
      {"plan", "--megatron-args-file", Script("llama3-8b-fp8"), "--gpu", "h100", "--top", "1"});
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  EXPECT_TRUE(Has(plan.out, "global batch 128 x 8192 tokens (fp8)")) << plan.out;
  EXPECT_TRUE(Has(plan.out, "1 x 8 h100")) << plan.out;
  // The script's configuration is searched around, and placed; every candidate keeps its
  // numerics (bf16 gradient reduction, FP8 parameters).
  EXPECT_TRUE(Has(plan.err, "the script's configuration tp=1,pp=1,dp=8,")) << plan.err;
  EXPECT_TRUE(Has(plan.out, ",dist_opt=on,grad_reduce_dtype=bf16,fp8_param_gather=on "))
      << plan.out;
  // What the model does not read, in one line (--cross-entropy-loss-fusion and
  // --fp8-param-gather it reads).
  EXPECT_TRUE(Has(r.err, "note: ignored (not modelled): --manual-gc --empty-unused-memory-level\n"))
      << r.err;
  // FP8 parameters with the distributed optimizer: no BF16 copy of the linear weights.
  EXPECT_TRUE(Has(r.out, "dist_opt=on,grad_reduce_dtype=bf16,fp8_param_gather=on\"")) << r.out;
  // --megatron-env overrides the script's assignment.
  const Result deeper = RunCli({"plan", "--megatron-args-file", Script("llama3-8b-fp8"), "--gpu",
                                "h100", "--top", "1", "--megatron-env", "SEQ_LENGTH=4096"});
  ASSERT_EQ(deeper.code, kExitOk) << deeper.err;
  EXPECT_TRUE(Has(deeper.out, "global batch 128 x 4096 tokens (fp8)")) << deeper.out;
}

// The Megatron-core MoE model zoo's Qwen3-235B-A22B long-context command (its benchmarking
// YAML's flags, the readme's --recompute-modules): virtual stages with the embedding and the loss
// counted in the split, selective recompute of the norms and the MoE layers. Both read; the
// configuration predicts as itself and leaves as the same flags.
TEST(CliScriptImport, Qwen3MoeRecipeReadsItsSplitAndRecomputeModules) {
  const std::string recipe =
      "--num-layers 94 --hidden-size 4096 --ffn-hidden-size 12288 --num-attention-heads 64 "
      "--kv-channels 128 --group-query-attention --num-query-groups 4 --swiglu "
      "--normalization RMSNorm --position-embedding-type rope "
      "--untie-embeddings-and-output-weights "
      "--disable-bias-linear --vocab-size 151936 --seq-length 4096 --max-position-embeddings 4096 "
      "--num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 1536 "
      "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 8 "
      "--num-layers-per-virtual-pipeline-stage 3 --expert-model-parallel-size 8 "
      "--expert-tensor-parallel-size 1 --account-for-embedding-in-pipeline-split "
      "--account-for-loss-in-pipeline-split --sequence-parallel --use-distributed-optimizer "
      "--micro-batch-size 1 --global-batch-size 256 --recompute-granularity selective "
      "--recompute-modules layernorm moe --bf16 --attention-dropout 0.0 --hidden-dropout 0.0 "
      "--moe-router-force-load-balancing";
  const Result csv = RunCli(
      {"predict", "--megatron-args", recipe, "--gpu", "h100", "--nnodes", "32", "--format", "csv"});
  ASSERT_TRUE(csv.code == kExitOk || csv.code == kExitInfeasible) << csv.err;
  EXPECT_TRUE(Has(csv.out,
                  "tp=4,pp=8,dp=8,cp=1,up=1,ep=8,etp=1,vpp=4,split_embedding=on,"
                  "split_loss=on,mbs=1,sp=on,recompute=selective,"
                  "recompute_modules=layernorm+moe,dist_opt=on"))
      << csv.out;
  EXPECT_FALSE(Has(csv.err, "--recompute-modules")) << csv.err;  // not among the ignored
  // The zoo's "forced balance" rows ran it; the model assumes balance and trials force it.
  EXPECT_FALSE(Has(csv.err, "--moe-router-force-load-balancing")) << csv.err;
  // 96 counted layers over 32 model chunks of 3: the first and the last stage 11 layers.
  EXPECT_TRUE(Has(csv.err, "uneven pipeline stages of 11|12|12|12|12|12|12|11 layers")) << csv.err;
  const Result flags = RunCli({"predict", "--megatron-args", recipe, "--gpu", "h100", "--nnodes",
                               "32", "--format", "megatron"});
  EXPECT_TRUE(Has(flags.out,
                  "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
                  "--num-virtual-stages-per-pipeline-rank 4"))
      << flags.out;
  EXPECT_TRUE(Has(flags.out, "--recompute-granularity selective --recompute-modules layernorm moe"))
      << flags.out;
}

TEST(CliScriptImport, PlanSaysWhereTheScriptsConfigurationRanks) {
  const std::string script =
      "GPUS=8\ntorchrun --nproc_per_node $GPUS --nnodes 1 pretrain_gpt.py --num-layers 32 "
      "--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --swiglu "
      "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
      "--untie-embeddings-and-output-weights --vocab-size 32000 --global-batch-size 256 --bf16 "
      "--tensor-model-parallel-size 8 --micro-batch-size 1 --attention-dropout 0 "
      "--hidden-dropout 0";
  const Result r = RunCli({"plan", "--megatron-args", script, "--gpu", "a100-80gb", "--top", "3"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  // Not pinned to tp=8: the search goes around the script's choice...
  EXPECT_TRUE(Has(r.out, "1    tp=")) << r.out;
  EXPECT_FALSE(Has(r.out.substr(0, r.out.find('\n', r.out.find("1    tp="))), "1    tp=8,"))
      << r.out;
  // ...and says where it ranks among the configurations that fit.
  EXPECT_TRUE(Has(r.err, "the script's configuration tp=8,pp=1,dp=1,")) << r.err;
  EXPECT_TRUE(Has(r.err, "% slower than the best")) << r.err;
  // Our own --tp pins as before.
  const Result pinned = RunCli({"plan", "--megatron-args", script, "--gpu", "a100-80gb", "--top",
                                "1", "--tensor-model-parallel-size", "8"});
  ASSERT_EQ(pinned.code, kExitOk) << pinned.err;
  EXPECT_TRUE(Has(pinned.out, "1    tp=8,")) << pinned.out;
}

TEST(CliScriptImport, AnUnsetVariableIsNamed) {
  const std::string script =
      "--num-layers $LAYERS --hidden-size 64 --num-attention-heads 4 "
      "--vocab-size 256 --seq-length 64 --global-batch-size 8";
  const Result r = RunCli({"predict", "--megatron-args", script, "--gpu", "a100-80gb",
                           "--nproc-per-node", "1", "--config", "tp=1"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_TRUE(Has(r.err, "--num-layers")) << r.err;
  EXPECT_TRUE(Has(r.err, "$LAYERS")) << r.err;
  const Result given = RunCli({"predict", "--megatron-args", script, "--megatron-env", "LAYERS=2",
                               "--gpu", "a100-80gb", "--nproc-per-node", "1", "--config", "tp=1"});
  EXPECT_EQ(given.code, kExitOk) << given.err;
  const Result bad = RunCli({"predict", "--megatron-env", "LAYERS", "--model", "tiny",
                             "--global-batch-size", "8", "--config", "tp=1"});
  EXPECT_EQ(bad.code, kExitBadInput);
  EXPECT_TRUE(Has(bad.err, "--megatron-env")) << bad.err;
}

}  // namespace
}  // namespace autopar::cli
