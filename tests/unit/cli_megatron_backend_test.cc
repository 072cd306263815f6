// The pure parts of `tune --backend megatron` (docs/trial.md §17): Megatron-LM's log as the trial
// reads it (fixtures of d98e8a6's formats in tests/data/megatron/), the stable-median rule, and
// the trial's command line. The end-to-end run is tests/fault/megatron_backend_test.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "autopar/cli/megatron_command.h"
#include "autopar/cli/megatron_log.h"
#include "autopar/cli/plan_format.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "autopar/spec/parse.h"
#include "autopar/spec/train.h"

namespace autopar::cli {
namespace {

// A fixture's log lines, without its '#' comments (which quote the formats).
std::string Fixture(const std::string& name) {
  std::ifstream in(std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/megatron/" + name);
  EXPECT_TRUE(in) << name;
  std::string text, line;
  while (std::getline(in, line)) {
    if (line.rfind('#', 0) != 0) text += line + "\n";
  }
  return text;
}

TEST(MegatronBackendLog, ReadsIterationsMemoryAndThroughput) {
  const MegatronLog log = ParseMegatronLog(Fixture("training_log_d98e8a6.txt"));
  ASSERT_EQ(log.iteration_ms.size(), 7u);
  EXPECT_EQ(log.iterations.front(), 1);
  EXPECT_EQ(log.iterations.back(), 7);
  EXPECT_DOUBLE_EQ(log.iteration_ms[0], 5321.7);
  EXPECT_DOUBLE_EQ(log.iteration_ms[1], 812.4);
  ASSERT_EQ(log.tflops_per_gpu.size(), 7u);
  EXPECT_DOUBLE_EQ(log.tflops_per_gpu[1], 401.2);
  EXPECT_DOUBLE_EQ(log.max_allocated_mb, 52011.75);  // the larger of the two reports
  EXPECT_DOUBLE_EQ(log.max_reserved_mb, 60012.0);
  EXPECT_FALSE(log.out_of_memory || log.nonfinite_loss || log.python_error);
  // Warm-up discarded, the median of the rest.
  const std::vector<double> timed = TimedIterationSeconds(log, 2);
  ASSERT_EQ(timed.size(), 5u);
  EXPECT_DOUBLE_EQ(MedianOf(timed), 0.8066);
}

TEST(MegatronBackendLog, OutOfMemoryAndNanAndPythonErrors) {
  const MegatronLog oom = ParseMegatronLog(Fixture("oom_log_d98e8a6.txt"));
  EXPECT_TRUE(oom.out_of_memory);
  EXPECT_TRUE(oom.python_error);
  EXPECT_NE(oom.error_tail.find("torch.OutOfMemoryError: CUDA out of memory"), std::string::npos);
  const MegatronLog nan = ParseMegatronLog(Fixture("nan_log_d98e8a6.txt"));
  EXPECT_TRUE(nan.nonfinite_loss);
  EXPECT_FALSE(nan.out_of_memory);
  // A NaN loss alone (no rerun check): Megatron prints no loss but counts the iteration.
  EXPECT_TRUE(ParseMegatronLog(" iteration 2/ 7 | elapsed time per iteration (ms): 8.0 | "
                               "number of nan iterations:   1 |\n")
                  .nonfinite_loss);
  EXPECT_FALSE(ParseMegatronLog(" iteration 2/ 7 | elapsed time per iteration (ms): 8.0 | "
                                "number of nan iterations:   0 |\n")
                   .nonfinite_loss);
  // A line still being written is not read.
  EXPECT_TRUE(ParseMegatronLog(" iteration 1/ 7 | elapsed time per iteration (ms): 8.0 |")
                  .iteration_ms.empty());
  const MegatronLog crash = ParseMegatronLog(
      "training ...\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
      "AssertionError: expected iteration-based training\n");
  EXPECT_TRUE(crash.python_error);
  EXPECT_FALSE(crash.out_of_memory);
  EXPECT_NE(crash.error_tail.find("expected iteration-based training"), std::string::npos);
}

TEST(MegatronBackendLog, StableMedian) {
  EXPECT_FALSE(MedianIsStable({1.0, 1.0}, 2, 0.01));            // fewer than 3
  EXPECT_FALSE(MedianIsStable({1.0, 1.0, 1.0, 1.0}, 5, 0.01));  // fewer than asked
  EXPECT_TRUE(MedianIsStable({1.0, 1.0, 1.0, 1.0, 1.0}, 5, 0.01));
  EXPECT_TRUE(MedianIsStable({1.0, 1.02, 0.99, 1.0, 1.3}, 5, 0.01));  // one outlier
  EXPECT_FALSE(MedianIsStable({1.0, 1.2, 1.0, 1.2, 1.2}, 5, 0.01));   // still moving
}

ParallelConfig Config(const std::string& spec) { return Complete(ParseSpec(spec), 8); }

TEST(MegatronBackendCommand, ReplacesParallelFlagsAndOwnsTheTrialSettings) {
  const ParallelConfig c = Config("tp=2,pp=2,vpp=2,mbs=2,sp=on,dist_opt=on");
  const std::vector<std::string> user = {"torchrun",
                                         "--nproc_per_node",
                                         "8",
                                         "pretrain_gpt.py",
                                         "--num-layers",
                                         "8",
                                         "--tensor-model-parallel-size",
                                         "4",
                                         "--sequence-parallel",
                                         "--tp-comm-overlap",
                                         "--no-overlap-p2p-communication",
                                         "--recompute-modules",
                                         "core_attn",
                                         "mlp",
                                         "--train-samples",
                                         "1000",
                                         "--data-path",
                                         "1.0",
                                         "/d/x",
                                         "--split=99,1,0",
                                         "--save",
                                         "/c",
                                         "--log-interval",
                                         "100",
                                         "--lr",
                                         "1e-4"};
  const std::vector<std::string> flags = SplitWords(
      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
      "--num-virtual-stages-per-pipeline-rank 2 --micro-batch-size 2 --global-batch-size 16 "
      "--sequence-parallel --use-distributed-optimizer");
  MegatronTrialSettings settings;
  settings.train_iters = 22;
  settings.exit_duration_mins = 10;
  std::vector<std::string> notes;
  const std::vector<std::string> got =
      MegatronTrialCommand({"python", "pretrain_gpt.py"}, user, flags, c, settings, &notes);
  const std::vector<std::string> want = {"python",
                                         "pretrain_gpt.py",
                                         "--num-layers",
                                         "8",
                                         "--tp-comm-overlap",
                                         "--lr",
                                         "1e-4",
                                         "--tensor-model-parallel-size",
                                         "2",
                                         "--pipeline-model-parallel-size",
                                         "2",
                                         "--num-virtual-stages-per-pipeline-rank",
                                         "2",
                                         "--micro-batch-size",
                                         "2",
                                         "--global-batch-size",
                                         "16",
                                         "--sequence-parallel",
                                         "--use-distributed-optimizer",
                                         "--train-iters",
                                         "22",
                                         "--log-interval",
                                         "1",
                                         "--eval-iters",
                                         "0",
                                         "--log-throughput",
                                         "--exit-duration-in-mins",
                                         "10",
                                         "--mock-data"};
  EXPECT_EQ(got, want);
  // vpp 2 at pp 2 needs p2p overlap: the switch that turns it off goes, with a note.
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("--no-overlap-p2p-communication"), std::string::npos);
  // Real data: the user's data flags stay and no --mock-data is added.
  settings.mock_data = false;
  const std::vector<std::string> real =
      MegatronTrialCommand({"python", "pretrain_gpt.py"}, user, flags, c, settings, nullptr);
  EXPECT_NE(std::find(real.begin(), real.end(), "/d/x"), real.end());
  EXPECT_EQ(std::find(real.begin(), real.end(), "--mock-data"), real.end());
}

TEST(MegatronBackendCommand, TpCommOverlapGoesWithoutSequenceParallelism) {
  std::vector<std::string> notes;
  const auto out =
      ReplaceParallelFlags({"--tp-comm-overlap", "--seq-length", "4096"},
                           SplitWords("--tensor-model-parallel-size 1"), Config("tp=1"), &notes);
  EXPECT_EQ(
      out, (std::vector<std::string>{"--seq-length", "4096", "--tensor-model-parallel-size", "1"}));
  EXPECT_EQ(notes.size(), 1u);
}

// launcher/megatron_flags.txt, built in: it reads, and a line it cannot read is named.
// FP8 parameters: the study's configuration says them, once; the user's own copy of the flag
// gives way to it.
TEST(MegatronBackendCommand, Fp8ParametersComeFromTheConfigurationOnce) {
  const ModelSpec m = ModelPreset("llama2-7b");
  TrainSpec t;
  t.global_batch_size = 64;
  t.precision = Precision::kFP8;
  const ParallelConfig c = Config("tp=2,dp=4,dist_opt=on,fp8_param_gather=on");
  const std::vector<std::string> out =
      ReplaceParallelFlags({"--fp8-format", "hybrid", "--fp8-param-gather", "--lr", "1e-4"},
                           SplitWords(MegatronFlags(c, m, t)), c, nullptr);
  EXPECT_EQ(std::count(out.begin(), out.end(), "--fp8-param-gather"), 1);
  EXPECT_EQ(std::count(out.begin(), out.end(), "--use-distributed-optimizer"), 1);
  EXPECT_EQ(std::count(out.begin(), out.end(), "--fp8-format"), 1);
}

TEST(MegatronBackendCommand, TheFlagTableReads) {
  EXPECT_EQ(CheckMegatronFlagsTable(MegatronFlagsText()), "");
  EXPECT_NE(std::string(MegatronFlagsText()).find("--tensor-model-parallel-size"),
            std::string::npos);
  EXPECT_EQ(CheckMegatronFlagsTable("# a comment\n--a one replaced\n--b switch conditional\n"
                                    "  needs --a>1|virtual=1 the reason\n"),
            "");
  // (table, what its error names)
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--a three replaced\n", "line 1"},
      {"--a one replaced\n--a one read\n", "line 2"},
      {"--a one replaced\n  needs --a>1 why\n", "line 2"},
      {"--b switch conditional\n  needs --c why\n", "--c"},
      {"--a one replaced\n--b switch conditional\n  needs --a>x why\n", "line 3"},
  };
  for (const auto& [table, named] : bad) {
    EXPECT_NE(CheckMegatronFlagsTable(table).find(named), std::string::npos) << table;
  }
}

// The conditions read the candidate's flags: overlap with the optimizer step needs the
// distributed optimizer, parameter-gather overlap and virtual stages; p2p overlap may only be
// switched off with virtual stages on more than two pipeline stages.
TEST(MegatronBackendCommand, ConditionalFlagsFollowTheTable) {
  const std::vector<std::string> user = {"--overlap-param-gather-with-optimizer-step",
                                         "--no-overlap-p2p-communication"};
  std::vector<std::string> notes;
  auto out = ReplaceParallelFlags(
      user,
      SplitWords("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
                 "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"),
      Config("tp=1,pp=4,vpp=2,dist_opt=on"), &notes);
  EXPECT_EQ(out[0], "--overlap-param-gather-with-optimizer-step");
  EXPECT_EQ(out[1], "--no-overlap-p2p-communication");
  EXPECT_TRUE(notes.empty());
  out = ReplaceParallelFlags(
      user, SplitWords("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2"),
      Config("tp=1,pp=2,vpp=2"), &notes);
  EXPECT_EQ(out[0], "--pipeline-model-parallel-size");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0],
            "dropped --overlap-param-gather-with-optimizer-step: it needs "
            "--use-distributed-optimizer");
  EXPECT_EQ(notes[1],
            "dropped --no-overlap-p2p-communication: virtual pipeline stages without p2p "
            "overlap need pp > 2");
}

TEST(MegatronBackendCommand, OneDeviceConnectionWhereMegatronNeedsIt) {
  EXPECT_FALSE(NeedsOneDeviceConnection(Config("tp=1"), {}));
  EXPECT_TRUE(NeedsOneDeviceConnection(Config("tp=2"), {}));
  EXPECT_TRUE(NeedsOneDeviceConnection(Config("cp=2"), {}));
  EXPECT_FALSE(NeedsOneDeviceConnection(Config("tp=2"), {"--use-torch-fsdp2"}));
}

}  // namespace
}  // namespace autopar::cli
