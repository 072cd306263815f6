#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/common/status.h"

namespace autopar::cli {
namespace {

struct Result {
  int code;
  std::string out, err;
};

Result RunCli(const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  const int code = Main(argv, out, err);
  return {code, out.str(), err.str()};
}

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
  const std::string path = ::testing::TempDir() + name;
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
}

TEST(Cli, EveryFormat) {
  for (const char* f : {"table", "json", "csv", "megatron", "yaml"}) {
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
  EXPECT_NE(pasted.out.find("1,2,2,2,1,1,1,1,2,on,none,0,off"), std::string::npos) << pasted.out;
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
  // rank,tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,recompute_layers,dist_opt,step_time_s,...
  std::istringstream fields(row);
  std::string field;
  for (int i = 0; i < 14; ++i) std::getline(fields, field, ',');
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

TEST(Cli, HuggingFaceConfigPlansLikeThePreset) {
  const std::string hf = std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/llama-2-7b-hf.config.json";
  std::vector<std::string> preset = Cmd("plan", Llama7bOn(1, {"--format", "csv"}));
  std::vector<std::string> from_hf = preset;
  from_hf[2] = hf;
  const Result a = RunCli(preset), b = RunCli(from_hf);
  ASSERT_EQ(a.code, kExitOk) << a.err;
  ASSERT_EQ(b.code, kExitOk) << b.err;
  EXPECT_EQ(a.out, b.out);
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
  if (row == std::string::npos) return -1;
  int column = 0;
  for (size_t at = 0; at < header.find("step_time_s"); ++at) column += header[at] == ',';
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
