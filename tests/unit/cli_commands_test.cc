#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/cli/help.h"
#include "autopar/common/errors.h"
#include "cli_test_util.h"

namespace autopar::cli {
namespace {

std::vector<std::string> Llama7bOn(int nnodes, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {"--model", "llama2-7b", "--gpu", "a100-80gb",
                                   "--nnodes", std::to_string(nnodes), "--nproc-per-node", "8",
                                   "--global-batch-size", "256", "--seq-length", "4096"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> Cmd(const std::string& command, std::vector<std::string> rest) {
  rest.insert(rest.begin(), command);
  return rest;
}

std::string TempFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Cli, PlanPrintsRankedTable) {
  const Result r = RunCli(Cmd("plan", Llama7bOn(2, {"--top", "3"})));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("rank config"), std::string::npos);
  EXPECT_NE(r.out.find("\n3    tp="), std::string::npos);
  EXPECT_EQ(r.out.find("\n4    tp="), std::string::npos);
}

TEST(Cli, PredictJsonHasTheContractKeys) {
  const Result r = RunCli(Cmd("predict", Llama7bOn(2, {"--config", "tp=2,pp=2,sp=on", "--format",
                                                    "json"})));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  for (const char* key : {"\"step_time_s\"", "\"tokens_per_s\"", "\"model_tflops_per_gpu\"",
                          "\"mfu\"", "\"peak_memory_gib\"", "\"fits\"", "\"breakdown\"",
                          "\"tp_comm\"", "\"activations\"", "\"megatron_args\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  }
  EXPECT_NE(r.out.find("tp=2,pp=2,dp=4,"), std::string::npos);
  // The interval the benchmark's error on published bf16 runs gives (docs/models.md §5.2).
  for (const char* key : {"\"prediction_spread\"", "\"step_time_low_s\"", "\"step_time_high_s\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  }
  const Result table = RunCli(Cmd("plan", Llama7bOn(2, {"--top", "2"})));
  EXPECT_NE(table.out.find("prediction interval: step_s ±8.3%"), std::string::npos) << table.out;
}

TEST(Cli, EveryFormat) {
  for (const char* f : {"table", "json", "csv", "megatron", "yaml", "bridge"}) {
    const Result r = RunCli(Cmd("plan", Llama7bOn(1, {"--top", "2", "--format", f})));
    EXPECT_EQ(r.code, kExitOk) << f << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << f;
  }
  const Result megatron = RunCli(Cmd("plan", Llama7bOn(1, {"--top", "1", "--format", "megatron"})));
  EXPECT_NE(megatron.out.find("--tensor-model-parallel-size"), std::string::npos);
}

TEST(Cli, MegatronFlagsDescribeTheConfigToPredict) {
  const Result pasted = RunCli(Cmd(
      "predict", Llama7bOn(1, {"--megatron-args",
                               "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                               "--sequence-parallel --micro-batch-size 2 --lr 3e-4 \\\n --bf16",
                               "--format", "csv"})));
  ASSERT_EQ(pasted.code, kExitOk) << pasted.err;
  EXPECT_NE(pasted.out.find("\"tp=2,pp=2,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=2,sp=on,recompute=none,"
                            "dist_opt=off"),
            std::string::npos)
      << pasted.out;
}

// A Megatron flag of several values takes the words up to the next flag on our command line too,
// as in a pasted script (argparse's nargs).
TEST(Cli, MegatronListFlagsTakeTheirWordsOnTheCommandLine) {
  const Result r = RunCli(Cmd(
      "predict", Llama7bOn(1, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "4",
                               "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                               "2", "2", "--sequence-parallel", "--format", "csv"})));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("\"tp=2,pp=1,dp=1,cp=2,up=2,"), std::string::npos) << r.out;
}

// The overlap knobs and the reduction dtype leave as Megatron's flags (which default off / fp32)
// and come back from them unchanged.
TEST(Cli, MegatronOverlapFlagsRoundTrip) {
  struct Want {
    const char* spec;
    bool grad, gather, bf16;
  };
  for (const Want& w :
       {Want{"tp=2,dist_opt=on", true, true, false}, Want{"tp=2", true, false, false},
        Want{"tp=2,dist_opt=on,overlap_param_gather=off", true, false, false},
        Want{"tp=2,dist_opt=on,overlap_grad_reduce=off", false, false, false},
        Want{"tp=2,overlap_grad_reduce=off,grad_reduce_dtype=bf16", false, false, true}}) {
    const Result out =
        RunCli(Cmd("predict", Llama7bOn(1, {"--config", w.spec, "--format", "megatron"})));
    ASSERT_EQ(out.code, kExitOk) << out.err;
    const std::string flags = out.out.substr(0, out.out.find('\n'));
    EXPECT_EQ(flags.find(" --overlap-grad-reduce") != std::string::npos, w.grad) << flags;
    EXPECT_EQ(flags.find(" --overlap-param-gather") != std::string::npos, w.gather) << flags;
    EXPECT_EQ(flags.find(" --grad-reduce-in-bf16") != std::string::npos, w.bf16) << flags;
    const Result back =
        RunCli(Cmd("predict", Llama7bOn(1, {"--megatron-args", flags, "--format", "megatron"})));
    ASSERT_EQ(back.code, kExitOk) << back.err;
    EXPECT_EQ(back.out, out.out) << w.spec;
    // The same configuration: the SPEC text agrees too.
    const Result spec_csv =
        RunCli(Cmd("predict", Llama7bOn(1, {"--config", w.spec, "--format", "csv"})));
    const Result flags_csv =
        RunCli(Cmd("predict", Llama7bOn(1, {"--megatron-args", flags, "--format", "csv"})));
    EXPECT_EQ(spec_csv.out, flags_csv.out) << w.spec;
  }
  // fp16 runs reduce in fp16 unless told: fp32 needs Megatron's flag, 16-bit none.
  for (const auto& [spec, flag] : {std::pair{"tp=2", " --accumulate-allreduce-grads-in-fp32"},
                                   std::pair{"tp=2,grad_reduce_dtype=bf16", ""}}) {
    const Result fp16 = RunCli(
        Cmd("predict", Llama7bOn(1, {"--fp16", "--config", spec, "--format", "megatron"})));
    ASSERT_EQ(fp16.code, kExitOk) << fp16.err;
    EXPECT_EQ(fp16.out.find(" --grad-reduce-in-bf16"), std::string::npos) << fp16.out;
    EXPECT_EQ(fp16.out.find(" --accumulate-allreduce-grads-in-fp32") != std::string::npos,
              std::string(flag).size() > 0)
        << fp16.out;
    const std::string flags = fp16.out.substr(0, fp16.out.find('\n'));
    const Result back = RunCli(Cmd(
        "predict", Llama7bOn(1, {"--fp16", "--megatron-args", flags, "--format", "megatron"})));
    ASSERT_EQ(back.code, kExitOk) << back.err;
    EXPECT_EQ(back.out, fp16.out) << spec;
  }
  // The earlier switches pin the knob off.
  const Result off =
      RunCli(Cmd("predict", Llama7bOn(1, {"--config", "tp=2,dist_opt=on",
                                          "--no-overlap-param-gather", "--format", "megatron"})));
  ASSERT_EQ(off.code, kExitOk) << off.err;
  EXPECT_NE(off.out.find("--overlap-grad-reduce"), std::string::npos);
  EXPECT_EQ(off.out.find("--overlap-param-gather"), std::string::npos);
}

// Bad input: exit code 2 and a message naming the flag or field (and the allowed values).
void ExpectBadInput(const std::vector<std::string>& argv, const std::string& must_mention) {
  const Result r = RunCli(argv);
  EXPECT_EQ(r.code, kExitBadInput) << r.out;
  EXPECT_NE(r.err.find(must_mention), std::string::npos) << "message: " << r.err;
}

// Mixtral-8x7B on 4 nodes of H100, with `extra` flags.
std::vector<std::string> Mixtral(std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      "--model", "mixtral-8x7b",        "--gpu", "h100",         "--nnodes",
      "4",       "--global-batch-size", "256",   "--seq-length", "4096"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// `predict` of Mixtral configured by Megatron's `flags`: its Megatron flags, its csv line, and
// the csv line of the same flags pasted as a script.
struct Predicted {
  Result megatron, csv, pasted;
};
Predicted PredictMixtral(const std::vector<std::string>& flags) {
  std::vector<std::string> megatron = flags, csv = flags;
  megatron.insert(megatron.end(), {"--format", "megatron"});
  csv.insert(csv.end(), {"--format", "csv"});
  std::string pasted;
  for (const std::string& w : flags) pasted += w + " ";
  return {RunCli(Cmd("predict", Mixtral(megatron))), RunCli(Cmd("predict", Mixtral(csv))),
          RunCli(Cmd("predict", Mixtral({"--megatron-args", pasted, "--format", "csv"})))};
}

// Megatron's --recompute-modules: what selective recompute reruns, in the configuration a
// command line or a script describes, in every selective candidate of a search, and back out in
// the flags; modules the model lacks, Megatron's refusals and names it does not know are refused
// naming the flag and the allowed values.
TEST(Cli, RecomputeModulesAreReadSearchedAndEmitted) {
  const std::vector<std::string> flags = {"--tensor-model-parallel-size",
                                          "2",
                                          "--pipeline-model-parallel-size",
                                          "4",
                                          "--expert-model-parallel-size",
                                          "4",
                                          "--sequence-parallel",
                                          "--use-distributed-optimizer",
                                          "--recompute-granularity",
                                          "selective",
                                          "--recompute-modules",
                                          "layernorm",
                                          "moe"};
  const auto [out, spec, script] = PredictMixtral(flags);
  ASSERT_EQ(out.code == kExitOk || out.code == kExitInfeasible, true) << out.err;
  EXPECT_NE(out.out.find("--recompute-granularity selective --recompute-modules layernorm moe"),
            std::string::npos)
      << out.out;
  EXPECT_NE(spec.out.find("recompute=selective,recompute_modules=layernorm+moe,"),
            std::string::npos)
      << spec.out;
  // The same from a pasted script: read, not listed as ignored.
  EXPECT_EQ(script.out, spec.out) << script.err;
  EXPECT_EQ(script.err.find("--recompute-modules"), std::string::npos) << script.err;
  // A search: every selective candidate reruns the modules; the others have none.
  const Result plan =
      RunCli(Cmd("plan", Mixtral({"--recompute-modules", "moe_act", "--fix", "tp=2,pp=4,ep=4,sp=on",
                                  "--top", "50", "--format", "csv"})));
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  EXPECT_NE(plan.out.find("recompute=selective,recompute_modules=moe_act"), std::string::npos);
  EXPECT_EQ(plan.out.find("recompute=selective,dist_opt"), std::string::npos) << plan.out;
  EXPECT_EQ(plan.out.find("=none,recompute_modules"), std::string::npos) << plan.out;

  ExpectBadInput(Cmd("plan", Mixtral({"--recompute-modules", "attention"})),
                 "--recompute-modules: allowed: core_attn, layernorm, mlp, moe, moe_act, "
                 "shared_experts; got 'attention'");
  ExpectBadInput(Cmd("plan", Mixtral({"--recompute-modules", "mla_up_proj"})), "not modelled");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--recompute-modules", "moe"})),
                 "--recompute-modules: recompute_modules=moe: moe, moe_act and shared_experts "
                 "need a MoE model");
  ExpectBadInput(Cmd("plan", Mixtral({"--recompute-modules", "mlp"})), "every layer");
  ExpectBadInput(Cmd("plan", Mixtral({"--recompute-modules", "shared_experts"})),
                 "no shared experts");
  ExpectBadInput(
      Cmd("plan", Mixtral({"--fp8-format", "hybrid", "--recompute-modules", "layernorm"})),
      "delayed scaling");
  ExpectBadInput(
      Cmd("predict", Llama7bOn(1, {"--config", "tp=2,recompute=selective,recompute_modules=moe"})),
      "need a MoE model");
}

// Megatron's flex token dispatcher (--moe-token-dispatcher-type flex, its DeepEP backend's old
// switch --moe-enable-deepep): read from the command line and a script, every candidate's in a
// search, emitted; refused for a dense model and for names Megatron does not have.
TEST(Cli, FlexDispatcherIsReadSearchedAndEmitted) {
  const std::vector<std::string> flags = {"--tensor-model-parallel-size",
                                          "2",
                                          "--pipeline-model-parallel-size",
                                          "4",
                                          "--expert-model-parallel-size",
                                          "4",
                                          "--sequence-parallel",
                                          "--moe-token-dispatcher-type",
                                          "flex",
                                          "--moe-flex-dispatcher-backend",
                                          "hybridep"};
  const auto [out, spec, script] = PredictMixtral(flags);
  ASSERT_EQ(out.code == kExitOk || out.code == kExitInfeasible, true) << out.err;
  EXPECT_NE(out.out.find("--expert-model-parallel-size 4 --moe-token-dispatcher-type flex"),
            std::string::npos)
      << out.out;
  EXPECT_NE(spec.out.find("ep=4,dispatcher=flex,"), std::string::npos) << spec.out;
  EXPECT_EQ(script.out, spec.out) << script.err;
  const Result deepep = RunCli(Cmd(
      "predict", Mixtral({"--megatron-args",
                          "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                          "--expert-model-parallel-size 4 --sequence-parallel --moe-enable-deepep",
                          "--format", "csv"})));
  EXPECT_EQ(deepep.out, spec.out) << deepep.err;
  // A search: every candidate dispatches by flex, so none has etp·ep = 1.
  const Result plan = RunCli(Cmd(
      "plan", Mixtral({"--moe-token-dispatcher-type", "flex", "--top", "50", "--format", "csv"})));
  ASSERT_EQ(plan.code, kExitOk) << plan.err;
  std::istringstream rows(plan.out);
  std::string row;
  int flex_rows = 0;
  while (std::getline(rows, row)) {
    if (row.find("tp=") == std::string::npos) continue;
    EXPECT_NE(row.find("dispatcher=flex"), std::string::npos) << row;
    ++flex_rows;
  }
  EXPECT_GT(flex_rows, 0) << plan.out;

  // A dense model's script may name it: Megatron ignores it there, and so does the tool (a note).
  const Result dense = RunCli(Cmd(
      "predict", Llama7bOn(1, {"--megatron-args",
                               "--tensor-model-parallel-size 2 --moe-token-dispatcher-type flex",
                               "--format", "csv"})));
  EXPECT_EQ(dense.code, kExitOk) << dense.err;
  EXPECT_NE(dense.err.find("--moe-token-dispatcher-type flex: ignored"), std::string::npos)
      << dense.err;
  EXPECT_EQ(dense.out.find("dispatcher"), std::string::npos) << dense.out;

  ExpectBadInput(Cmd("plan", Mixtral({"--moe-token-dispatcher-type", "deepep"})),
                 "--moe-token-dispatcher-type: allowed: alltoall, flex, allgather; got 'deepep'");
  ExpectBadInput(Cmd("plan", Mixtral({"--moe-flex-dispatcher-backend", "nvshmem"})),
                 "--moe-flex-dispatcher-backend: allowed: deepep, hybridep, ncclep");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--moe-token-dispatcher-type", "flex"})),
                 "--moe-token-dispatcher-type: flex dispatches a mixture-of-experts model's");
  ExpectBadInput(Cmd("predict", Mixtral({"--config", "tp=2,pp=4,sp=on,etp=1,dispatcher=flex"})),
                 "etp·ep > 1");
}

TEST(Cli, BadInputNamesTheFlagAndExitsTwo) {
  ExpectBadInput({"plan", "--model", "llama9-1b", "--global-batch-size", "8"}, "--model");
  ExpectBadInput({"plan", "--model", "llama9-1b", "--global-batch-size", "8"}, "llama2-70b");
  ExpectBadInput(Cmd("predict", Llama7bOn(3, {"--config", "tp=3"})), "num_attention_heads");
  ExpectBadInput(Cmd("predict", Llama7bOn(1, {"--config", "tp=2,dp=3"})), "world size");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--tp", "3"})), "--tp");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--format", "xml"})), "table, json, csv");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--bogus-flag", "1"})), "--bogus-flag");
  ExpectBadInput({"plan", "--model", "llama2-7b", "--global-batch-size", "0"},
                 "--global-batch-size");
  ExpectBadInput({"plan", "--model", "llama2-7b", "--global-batch-size", "-4"},
                 "--global-batch-size");
  ExpectBadInput({"plan", "--model", "llama2-7b"}, "--global-batch-size");
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--nnodes", "0"})), "--nnodes");
  ExpectBadInput({"plan", "--model", "llama2-7b", "--num-layers", "-2", "--global-batch-size", "8"},
                 "--num-layers");
  ExpectBadInput({"plan", "--global-batch-size", "8"}, "--model");
  ExpectBadInput({"frobnicate"}, "plan, predict");
  ExpectBadInput({"plan", "--model", "/nonexistent/model.yaml", "--global-batch-size", "8"},
                 "--model");
#if defined(AUTOPAR_WITH_TRIALS)  // the trial command exists only with the trial runner
  // --p2p-semantics: named with its allowed values, before MPI or the study is touched.
  const std::vector<std::string> tiny = {"--model", "tiny", "--nnodes", "2", "--nproc-per-node",
                                         "2", "--global-batch-size", "16"};
  std::vector<std::string> trial = {"trial", "--config", "pp=2", "--p2p-semantics", "tcp"};
  trial.insert(trial.end(), tiny.begin(), tiny.end());
  ExpectBadInput(trial, "--p2p-semantics");
  ExpectBadInput(trial, "mpi, nccl");
  std::vector<std::string> cuda_mpi = {"trial", "--backend", "cuda", "--p2p-semantics", "mpi"};
  cuda_mpi.insert(cuda_mpi.end(), tiny.begin(), tiny.end());
  ExpectBadInput(cuda_mpi, "--p2p-semantics");
#endif
  // make-replay-table --world: named with the families.
  ExpectBadInput(Cmd("make-replay-table", Llama7bOn(1, {"--world", "wobbly"})), "--world");
  ExpectBadInput(Cmd("make-replay-table", Llama7bOn(1, {"--world", "wobbly"})),
                 "scaled, interactions, kernel, memory, noisy, near_memory, mixed");
}

TEST(Cli, MakeReplayTableWritesAWorld) {
  const Result scaled = RunCli(Cmd("make-replay-table", Llama7bOn(1)));
  ASSERT_EQ(scaled.code, kExitOk) << scaled.err;
  EXPECT_EQ(scaled.out, RunCli(Cmd("make-replay-table", Llama7bOn(1, {"--world", "scaled"}))).out);
  const Result noisy = RunCli(Cmd("make-replay-table", Llama7bOn(1, {"--world", "noisy"})));
  ASSERT_EQ(noisy.code, kExitOk) << noisy.err;
  EXPECT_EQ(noisy.out.substr(0, noisy.out.find('\n')).substr(noisy.out.find(",noise_sd")),
            ",noise_sd");
  EXPECT_NE(noisy.err.find("measurement noise sd"), std::string::npos) << noisy.err;
}

// The first ranked line's step time of `predict --config SPEC` for the tiny model on 4 cpu ranks.
double TinyCpuStepTime(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"predict", "--model", "tiny", "--gpu", "cpu", "--nnodes", "2",
                                   "--nproc-per-node", "2", "--global-batch-size", "16",
                                   "--config", "tp=1,pp=2,mbs=1", "--format", "csv"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const Result r = RunCli(argv);
  EXPECT_EQ(r.code, kExitOk) << r.err;
  std::istringstream lines(r.out);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  // Rank,Model Name,Seq Length,TP,PP,CP,EP,VP,MBS,Act Ckpt Layers,Num Layers,GBS,Nodes,
  // GPUs per Node,Time per Step,...
  EXPECT_EQ(header.rfind("Rank,Model Name,Seq Length,TP,PP,CP,EP,VP,MBS,Act Ckpt Layers,Num "
                         "Layers,GBS,Nodes,GPUs per Node,Time per Step,",
                         0),
            0u)
      << header;
  std::istringstream fields(row);
  std::string field;
  for (int i = 0; i < 15; ++i) std::getline(fields, field, ',');
  return std::stod(field);
}

TEST(Cli, TheCpuDeviceTrainsInFp32OnItsShareOfTheHostCores) {
  const Result r = RunCli({"predict", "--model", "tiny", "--gpu", "cpu", "--nnodes", "2",
                           "--nproc-per-node", "2", "--global-batch-size", "16", "--bf16",
                           "--config", "tp=2"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("(fp32)"), std::string::npos) << r.out;
  // Four ranks on two cores: each computes at half a core, so the step takes twice as long
  // (nothing in it is communication-bound enough to matter less than that: pp p2p only).
  const double own_core = TinyCpuStepTime({});
  const double shared = TinyCpuStepTime({"--host-cores", "2"});
  EXPECT_GT(shared / own_core, 1.8);
  EXPECT_LE(shared / own_core, 2.0 + 1e-9);
  EXPECT_DOUBLE_EQ(TinyCpuStepTime({"--host-cores", "8"}), own_core);  // never more than a core
  ExpectBadInput(Cmd("plan", Llama7bOn(1, {"--host-cores", "4"})), "--host-cores");
  ExpectBadInput({"plan", "--model", "tiny", "--gpu", "cpu", "--nnodes", "1", "--nproc-per-node",
                  "4", "--global-batch-size", "16", "--host-cores", "0"},
                 "--host-cores");
}

TEST(Cli, MalformedFilesAreBadInput) {
  const std::string yaml = TempFile("bad_model.yaml", "num_layers: [1, 2\nhidden_size: 4\n");
  ExpectBadInput({"plan", "--model", yaml, "--global-batch-size", "8"}, "YAML");
  const std::string json = TempFile("bad_config.json", "{\"num_hidden_layers\": 32,,}");
  const Result r = RunCli({"plan", "--model", json, "--global-batch-size", "8"});
  EXPECT_EQ(r.code, kExitBadInput) << r.err;
  const std::string heads = TempFile("heads.yaml", "base: llama2-7b\nnum_attention_heads: 0\n");
  ExpectBadInput({"plan", "--model", heads, "--global-batch-size", "8"}, "num_attention_heads");
}

TEST(Cli, NoFeasibleConfigurationExitsThree) {
  const Result r = RunCli({"plan", "--model", "llama2-70b", "--gpu", "a100-40gb", "--nnodes", "1",
                        "--nproc-per-node", "1", "--global-batch-size", "8"});
  EXPECT_EQ(r.code, kExitInfeasible);
  EXPECT_NE(r.err.find("fits in memory"), std::string::npos) << r.err;
}

// GB200/GB300 NVL72 as torchrun launches a rack: 18 trays of 4 GPUs in one NVLink domain. (The
// 72 GPUs leave a factor 9 to dp while pp divides llama2-70b's 80 layers, so the batch is 576.)
std::vector<std::string> Llama70bOnARack(const std::string& gpu, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--model", "llama2-70b", "--gpu", gpu};
  for (const char* word : {"--nnodes", "18", "--nproc-per-node", "4", "--global-batch-size", "576",
                           "--seq-length", "4096"}) {
    argv.push_back(word);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

double JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  const std::regex re("\"" + key + "\":([-0-9.eE+]+)");
  if (!std::regex_search(json, m, re)) return -1;
  return std::stod(m[1]);
}

TEST(Cli, Nvl72RacksRankTensorParallelAcrossTraysOnNvlink) {
  for (const char* gpu : {"gb200", "gb300"}) {
    SCOPED_TRACE(gpu);
    const Result all = RunCli(Cmd("plan", Llama70bOnARack(gpu, {"--top", "5"})));
    ASSERT_EQ(all.code, kExitOk) << all.err;
    EXPECT_NE(all.out.find("NVLink domains of 72 GPUs (18 nodes)"), std::string::npos) << all.out;
    // tp = 8 spans two trays and is in the space without --tp-across-nodes.
    const Result tp8 = RunCli(Cmd("plan", Llama70bOnARack(gpu, {"--tp", "8", "--format", "json"})));
    ASSERT_EQ(tp8.code, kExitOk) << tp8.err;
    EXPECT_NE(tp8.out.find("\"config\":\"tp=8,"), std::string::npos) << tp8.out;
    EXPECT_EQ(JsonNumber(tp8.out, "nvlink_domain_gpus"), 72);
  }
  // The same configuration on the same trays with NVLink only inside a tray pays the NICs.
  const std::string trays =
      TempFile("gb200_trays.yaml",
               "nnodes: 18\ngpus_per_node: 4\ngpu: {base: gb200, nvlink_domain_gpus: 4}\n");
  const std::vector<std::string> config = {"--config", "tp=8,sp=on,mbs=1", "--format", "json"};
  const Result rack = RunCli(Cmd("predict", Llama70bOnARack("gb200", config)));
  ASSERT_EQ(rack.code, kExitOk) << rack.err;
  std::vector<std::string> separate = {"predict", "--model", "llama2-70b", "--cluster", trays};
  for (const char* word : {"--global-batch-size", "576", "--seq-length", "4096"}) {
    separate.push_back(word);
  }
  separate.insert(separate.end(), config.begin(), config.end());
  const Result nics = RunCli(separate);
  ASSERT_EQ(nics.code, kExitOk) << nics.err;
  const double on_nvlink = JsonNumber(rack.out, "tp_comm"),
               on_nics = JsonNumber(nics.out, "tp_comm");
  EXPECT_GT(on_nvlink, 0);
  EXPECT_GT(on_nics, 3 * on_nvlink) << rack.out << "\n" << nics.out;
  // The tray-sized domain keeps plan's tp inside a tray unless --tp-across-nodes.
  ExpectBadInput({"plan", "--model", "llama2-70b", "--cluster", trays, "--global-batch-size", "576",
                  "--tp", "8"},
                 "NVLink domain of 4 GPUs");
  const Result across = RunCli({"plan", "--model", "llama2-70b", "--cluster", trays,
                                "--global-batch-size", "576", "--tp", "8", "--tp-across-nodes"});
  EXPECT_EQ(across.code, kExitOk) << across.err;
  // A rack's 72 GPUs are not whole nodes of 16.
  ExpectBadInput({"plan", "--model", "llama2-70b", "--gpu", "gb200", "--nnodes", "9",
                  "--nproc-per-node", "16", "--global-batch-size", "576"},
                 "nvlink_domain_gpus");
}

TEST(Cli, HuggingFaceConfigPlansLikeThePreset) {
  const std::string hf = std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/llama-2-7b-hf.config.json";
  std::vector<std::string> preset = Cmd("plan", Llama7bOn(1, {"--format", "csv"}));
  std::vector<std::string> from_hf = preset;
  from_hf[2] = hf;
  const Result a = RunCli(preset), b = RunCli(from_hf);
  ASSERT_EQ(a.code, kExitOk) << a.err;
  ASSERT_EQ(b.code, kExitOk) << b.err;
  // The same rows; only the Model Name column says where the model came from.
  std::string renamed = b.out;
  const std::string hf_name = ",meta-llama/Llama-2-7b-hf,";
  for (size_t at; (at = renamed.find(hf_name)) != std::string::npos;) {
    renamed.replace(at, hf_name.size(), ",llama2-7b,");
  }
  EXPECT_NE(renamed, b.out);
  EXPECT_EQ(a.out, renamed);
}

TEST(Cli, PredictOfAConfigurationThatDoesNotFitExitsThreeAndPrintsItsEstimate) {
  const std::vector<std::string> job = {
      "predict",          "--model", "llama2-70b",          "--gpu", "a100-40gb", "--nnodes", "1",
      "--nproc-per-node", "8",       "--global-batch-size", "8",     "--config",  "tp=1,pp=1"};
  const Result table = RunCli(job);
  EXPECT_EQ(table.code, kExitInfeasible) << table.err;
  EXPECT_NE(table.out.find("(OOM)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("(does not fit)"), std::string::npos) << table.out;
  EXPECT_NE(table.err.find("more than the"), std::string::npos) << table.err;
  std::vector<std::string> json = job;
  json.insert(json.end(), {"--format", "json"});
  const Result j = RunCli(json);
  EXPECT_EQ(j.code, kExitInfeasible);
  EXPECT_NE(j.out.find("\"fits\":false"), std::string::npos) << j.out;
  // The same command for a model that fits: exit 0.
  std::vector<std::string> fits = job;
  fits[2] = "llama2-7b";
  fits.back() = "tp=8";
  const Result ok = RunCli(fits);
  EXPECT_EQ(ok.code, kExitOk) << ok.err;
  EXPECT_EQ(ok.out.find("(OOM)"), std::string::npos) << ok.out;
}

// Every command's --help (or -h, or `help COMMAND`) prints its usage on stdout and exits 0,
// wherever the flag stands, without running the command.
TEST(Cli, HelpPerCommand) {
  const Result top = RunCli({"--help"});
  EXPECT_EQ(top.code, kExitOk);
  for (const CommandHelp& c : Commands()) {
    EXPECT_NE(top.out.find(std::string("\n  ") + c.name + " "), std::string::npos) << c.name;
    const Result help = RunCli({c.name, "--help"});
    EXPECT_EQ(help.code, kExitOk) << c.name << ": " << help.err;
    EXPECT_EQ(help.out.rfind(std::string("usage: autopar-tune ") + c.name, 0), 0u) << help.out;
    EXPECT_TRUE(help.err.empty()) << help.err;
    EXPECT_EQ(RunCli({c.name, "-h"}).out, help.out) << c.name;
    EXPECT_EQ(RunCli({"help", c.name}).out, help.out) << c.name;
    for (const FlagGroup* g : c.groups) {
      for (const FlagHelp& f : g->flags) {
        EXPECT_NE(help.out.find(f.flag), std::string::npos) << c.name << " " << f.flag;
      }
    }
    std::istringstream lines(help.out);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_LE(line.size(), 100u) << c.name << ": " << line;  // docs/style.md §1
    }
  }
  // Among other flags, and the implicit tune.
  const Result plan = RunCli(Cmd("plan", Llama7bOn(1, {"--help"})));
  EXPECT_EQ(plan.code, kExitOk);
  EXPECT_EQ(plan.out, RunCli({"plan", "--help"}).out);
  const std::string study = ::testing::TempDir() + "help_study";
  const Result tune = RunCli({"--study", study, "--help"});
  EXPECT_EQ(tune.code, kExitOk);
  EXPECT_EQ(tune.out, RunCli({"tune", "--help"}).out);
  EXPECT_FALSE(std::filesystem::exists(study));
  // A pasted script's own --help is not ours.
  EXPECT_EQ(RunCli(Cmd("plan", Llama7bOn(1, {"--megatron-args", "--help"}))).out.find("usage:"),
            std::string::npos);
  ExpectBadInput({"help", "frobnicate"}, "plan, predict");
  // No arguments at all: the usage on stderr, exit 2.
  const Result none = RunCli({});
  EXPECT_EQ(none.code, kExitBadInput);
  EXPECT_NE(none.err.find("usage: autopar-tune"), std::string::npos);
}

// A command line of each command that reads all its flags. Those that would start something
// (a study, trials) fail afterwards on bad input of their own: the replay table is not there,
// --backend cuda has no --gpu, the study does not exist.
std::vector<std::string> ReadsEveryFlag(const std::string& command) {
  std::vector<std::string> argv = {command};
  if (command == "report") return {command, "--study", "/nonexistent/study"};
  if (command == "presets") return argv;
  if (command == "tune") {
    argv.insert(argv.end(), {"--study", ::testing::TempDir() + "flags_study", "--backend", "replay",
                             "--replay-table", "/nonexistent/table.csv"});
  }
  if (command == "trial" || command == "probe") argv.insert(argv.end(), {"--backend", "cuda"});
  if (command == "predict") argv.insert(argv.end(), {"--config", "tp=1"});
  argv.insert(argv.end(), {"--model", "tiny", "--nnodes", "1", "--nproc-per-node", "2",
                           "--global-batch-size", "16"});
  return argv;
}

// The help names only flags the command reads: each, given a value ("1", or a path where a file
// goes), is read (it may be refused, never as an unknown flag), and starts nothing.
TEST(Cli, EveryFlagTheHelpListsIsRead) {
  // A path that does not exist, where a flag's file would be read or written (and removed).
  const std::string sample_path = ::testing::TempDir() + "flag_sample";
  std::filesystem::remove_all(sample_path);
  std::filesystem::remove_all(::testing::TempDir() + "flags_study");
  for (const CommandHelp& c : Commands()) {
    const std::string name = c.name;
    const bool starts_something = name == "tune" || name == "trial" || name == "probe";
    const Result base = RunCli(ReadsEveryFlag(name));
    EXPECT_EQ(base.err.find("unknown flag"), std::string::npos) << name << ": " << base.err;
    if (starts_something) {
      EXPECT_EQ(base.code, kExitBadInput) << name << ": " << base.err;
    }
    for (const FlagGroup* g : c.groups) {
      for (const FlagHelp& f : g->flags) {
        std::vector<std::string> argv = ReadsEveryFlag(name);
        argv.push_back(f.flag);
        const std::string value = f.value;
        if (!value.empty()) {
          const bool path =
              value.find("FILE") != std::string::npos || value.find("DIR") != std::string::npos;
          argv.push_back(path ? sample_path : "1");
        }
        const Result r = RunCli(argv);
        std::filesystem::remove_all(sample_path);  // make-replay-table --output writes it
        EXPECT_EQ(r.err.find("unknown flag"), std::string::npos) << name << ": " << r.err;
        if (starts_something) {
          EXPECT_EQ(r.code, kExitBadInput) << name << " " << f.flag;
        }
      }
    }
  }
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "flags_study"));
  // The check can fail: a flag nobody reads is unknown.
  for (const char* command : {"plan", "tune", "report"}) {
    std::vector<std::string> argv = ReadsEveryFlag(command);
    argv.push_back("--bogus");
    EXPECT_NE(RunCli(argv).err.find("unknown flag"), std::string::npos) << command;
  }
}

// --version prints the project version of CMakeLists.txt and starts nothing.
TEST(Cli, VersionIsTheProjectVersion) {
  std::ifstream cmake(std::string(AUTOPAR_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream text;
  text << cmake.rdbuf();
  std::smatch m;
  const std::string lists = text.str();
  ASSERT_TRUE(
      std::regex_search(lists, m, std::regex(R"(project\(autopar-tune VERSION ([0-9.]+))")));
  EXPECT_EQ(std::string(Version()), m[1].str());
  const std::string study = ::testing::TempDir() + "version_study";
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"--version"},
        {"--study", study, "--version"},
        {"plan", "--version"},
        {"tune", "--study", study, "--backend", "cpu", "--version"}}) {
    const Result r = RunCli(argv);
    EXPECT_EQ(r.code, kExitOk) << r.err;
    EXPECT_EQ(r.out, "autopar-tune " + m[1].str() + "\n");
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(study));
}

// The stack's statements change the estimate: --tp-comm-overlap (a Megatron flag, on our command
// line or in a pasted script) hides tensor-parallel collectives of an sp configuration,
// --cross-entropy-loss-fusion shortens the loss's passes, --attention-efficiency sets the
// attention kernel's efficiency (a bad value is refused), and --no-async-tp-backward exposes the
// backward tensor-parallel collectives that today's Megatron runs beside their GEMMs.
TEST(Cli, StackFlagsChangeTheEstimate) {
  const std::vector<std::string> tp8 = {"--config", "tp=8,sp=on,mbs=1", "--format", "json"};
  const Result plain = RunCli(Cmd("predict", Llama7bOn(1, tp8)));
  ASSERT_EQ(plain.code, kExitOk) << plain.err;
  std::vector<std::string> flagged = tp8;
  flagged.push_back("--tp-comm-overlap");
  const Result overlap = RunCli(Cmd("predict", Llama7bOn(1, flagged)));
  ASSERT_EQ(overlap.code, kExitOk) << overlap.err;
  EXPECT_LT(JsonNumber(overlap.out, "tp_comm"), 0.5 * JsonNumber(plain.out, "tp_comm"));
  EXPECT_LT(JsonNumber(overlap.out, "step_time_s"), JsonNumber(plain.out, "step_time_s"));
  const Result pasted = RunCli(Cmd(
      "predict", Llama7bOn(1, {"--megatron-args",
                               "--tensor-model-parallel-size 8 --sequence-parallel "
                               "--micro-batch-size 1 --tp-comm-overlap --cross-entropy-loss-fusion",
                               "--format", "json"})));
  ASSERT_EQ(pasted.code, kExitOk) << pasted.err;
  EXPECT_EQ(JsonNumber(pasted.out, "tp_comm"), JsonNumber(overlap.out, "tp_comm"));
  EXPECT_EQ(pasted.err.find("ignored"), std::string::npos) << pasted.err;  // both modelled
  EXPECT_LT(JsonNumber(pasted.out, "memory_bound"), JsonNumber(overlap.out, "memory_bound"));

  std::vector<std::string> slow = tp8;
  slow.insert(slow.end(), {"--attention-efficiency", "0.2"});
  const Result slower = RunCli(Cmd("predict", Llama7bOn(1, slow)));
  ASSERT_EQ(slower.code, kExitOk) << slower.err;
  EXPECT_GT(JsonNumber(slower.out, "attention"), 2 * JsonNumber(plain.out, "attention"));
  std::vector<std::string> exposed = tp8;
  exposed.push_back("--no-async-tp-backward");
  const Result old_stack = RunCli(Cmd("predict", Llama7bOn(1, exposed)));
  ASSERT_EQ(old_stack.code, kExitOk) << old_stack.err;
  EXPECT_GT(JsonNumber(old_stack.out, "tp_comm"), JsonNumber(plain.out, "tp_comm"));
  EXPECT_GT(JsonNumber(old_stack.out, "step_time_s"), JsonNumber(plain.out, "step_time_s"));
  for (const char* bad : {"0", "1.5", "fast"}) {
    ExpectBadInput(
        Cmd("predict", Llama7bOn(1, {"--config", "tp=8", "--attention-efficiency", bad})),
        "--attention-efficiency");
  }
}

// No silent default GPU: planning says which one it assumes; the CUDA backend needs it named.
TEST(Cli, AnAssumedGpuIsNamedOrRefused) {
  // One pipeline stage: a plan with uneven stages adds a note of its split to stderr.
  const std::vector<std::string> job = {
      "plan", "--model", "tiny", "--global-batch-size", "16", "--top", "1", "--pp", "1"};
  const Result assumed = RunCli(job);
  ASSERT_EQ(assumed.code, kExitOk) << assumed.err;
  EXPECT_NE(assumed.err.find("assuming --gpu a100-80gb"), std::string::npos) << assumed.err;
  EXPECT_EQ(std::count(assumed.err.begin(), assumed.err.end(), '\n'), 1) << assumed.err;
  EXPECT_NE(assumed.out.find("a100-80gb"), std::string::npos) << assumed.out;
  std::vector<std::string> named = job;
  named.insert(named.end(), {"--gpu", "a100-80gb"});
  const Result given = RunCli(named);
  EXPECT_TRUE(given.err.empty()) << given.err;
  // The same plan, but for how long ranking took.
  const auto untimed = [](std::string text) {
    const size_t at = text.find("; ranked in ");
    if (at != std::string::npos) text.erase(at, text.find('\n', at) - at);
    return text;
  };
  EXPECT_EQ(untimed(given.out), untimed(assumed.out));
  const std::string cluster = TempFile("cluster.yaml", "nnodes: 1\ngpus_per_node: 8\ngpu: h100\n");
  std::vector<std::string> from_file = job;
  from_file.insert(from_file.end(), {"--cluster", cluster});
  EXPECT_TRUE(RunCli(from_file).err.empty());
  const std::vector<std::string> predict = {"predict", "--model",  "tiny", "--global-batch-size",
                                            "16",      "--config", "tp=2"};
  EXPECT_NE(RunCli(predict).err.find("assuming --gpu a100-80gb"), std::string::npos);
  // --backend cuda: the GPU the trials run on must be named.
  ExpectBadInput({"tune", "--study", ::testing::TempDir() + "cuda_study", "--backend", "cuda",
                  "--model", "tiny", "--global-batch-size", "16"},
                 "--gpu");
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "cuda_study"));
  // FP8 parameters: our trials keep 16-bit ones, so the study is refused before it starts.
  ExpectBadInput({"tune", "--study", ::testing::TempDir() + "cuda_study", "--backend", "cuda",
                  "--model", "tiny", "--gpu", "h100", "--global-batch-size", "16", "--fp8-format",
                  "hybrid", "--fix", "fp8_param_gather=on"},
                 "--fp8-param-gather: not with --backend cuda");
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "cuda_study"));
  // --backend megatron keeps a script's --fp8-param-gather in every trial: it cannot be pinned off.
  ExpectBadInput({"tune", "--study", ::testing::TempDir() + "cuda_study", "--backend", "megatron",
                  "--train-command", "python pretrain_gpt.py", "--model", "tiny", "--gpu", "h100",
                  "--global-batch-size", "16", "--megatron-args",
                  "--fp8-format hybrid --use-distributed-optimizer --fp8-param-gather", "--fix",
                  "fp8_param_gather=off"},
                 "--fix: fp8_param_gather=off, but the script passes --fp8-param-gather");
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "cuda_study"));
}

// Issue 11's acceptance: today's Hugging Face families plan from their config.json as published.
TEST(Cli, TodaysHuggingFaceFamiliesPlan) {
  const std::string dir = std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/";
  const std::pair<const char*, const char*> cases[] = {{"qwen3-30b-a3b.config.json", "2"},
                                                       {"qwen3-235b-a22b.config.json", "16"},
                                                       {"gpt-oss-20b.config.json", "1"},
                                                       {"gpt-oss-120b.config.json", "4"},
                                                       {"gemma-2-9b.config.json", "1"},
                                                       {"gemma-3-1b-it.config.json", "1"},
                                                       {"phi-3-mini-4k-instruct.config.json", "1"}};
  for (const auto& [file, nnodes] : cases) {
    const Result r = RunCli({"plan", "--model", dir + file, "--gpu", "h100", "--nnodes", nnodes,
                             "--nproc-per-node", "8", "--global-batch-size", "512", "--seq-length",
                             "4096", "--top", "1", "--format", "csv"});
    EXPECT_EQ(r.code, kExitOk) << file << ": " << r.err;
    EXPECT_NE(r.out.find("\n1,"), std::string::npos) << file << ": " << r.out;
    EXPECT_NE(r.out.find(",true"), std::string::npos) << file << ": " << r.out;
  }
}

// The best plan's step time from `plan --top 1 --format csv` (column step_time_s).
double BestStepTime(const Result& r) {
  const std::string header = r.out.substr(0, r.out.find('\n'));
  const size_t row = r.out.find("\n1,");
  const size_t time_column = header.find("Time per Step");
  if (row == std::string::npos || time_column == std::string::npos) return -1;
  int column = 0;
  for (size_t at = 0; at < time_column; ++at) column += header[at] == ',';
  size_t at = row + 1;
  for (int i = 0; i < column; ++i) at = r.out.find(',', at) + 1;
  return std::stod(r.out.substr(at, r.out.find(',', at) - at));
}

TEST(Cli, SlidingWindowShortensLongSequencePlans) {
  const std::string mistral =
      std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/mistral-7b-v0.1.config.json";
  const std::vector<std::string> argv = {"plan",  "--model",
                                         mistral, "--gpu",
                                         "h100",  "--nnodes",
                                         "1",     "--nproc-per-node",
                                         "8",     "--global-batch-size",
                                         "64",    "--seq-length",
                                         "32768", "--top",
                                         "1",     "--format",
                                         "csv"};
  std::vector<std::string> full = argv;
  full.insert(full.end(), {"--window-size", "-1,0"});  // Megatron's "no window"
  const Result windowed = RunCli(argv), unwindowed = RunCli(full);
  ASSERT_EQ(windowed.code, kExitOk) << windowed.err;
  ASSERT_EQ(unwindowed.code, kExitOk) << unwindowed.err;
  EXPECT_GT(BestStepTime(windowed), 0);
  EXPECT_LT(BestStepTime(windowed), 0.8 * BestStepTime(unwindowed));
}

TEST(Cli, MisspeltExpertKeyIsBadInput) {
  std::ifstream in(std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/deepseek-v3.config.json");
  std::stringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  json.replace(json.find("\"n_routed_experts\""), 18, "\"n_routed_expert\"");
  const std::string path = TempFile("misspelt.config.json", json);
  ExpectBadInput(
      {"plan", "--model", path, "--gpu", "h800", "--nnodes", "128", "--global-batch-size", "4096"},
      "n_routed_expert");
}

}  // namespace
}  // namespace autopar::cli
