// The proof that a trial is real: one step of a small model gives the same loss and the same
// updated weights on one rank and under every distributed layout (fp32, CPU backend).
#include <gtest/gtest.h>

#include <cmath>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "autopar/trial/trial.h"
#include "mpi_env.h"

namespace autopar::trial {
namespace {

using backend::Outcome;
using backend::testing::TestBackend;
using backend::testing::World;

TrainSpec Train() {
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = 64;
  t.precision = Precision::kFP32;
  return t;
}

TrialOptions NumericOptions() {
  TrialOptions o;
  o.warmup_iterations = 0;
  o.timed_iterations = 2;  // the second step reads Adam's moments of the first
  o.max_microbatches = -1;
  o.fingerprint = true;
  o.learning_rate = 1e-2f;
  o.adam_eps = 1.0f;
  o.timeout_s = 120;
  return o;
}

// The single-rank reference: every rank runs it alone on a group of its own.
TrialMeasurement Reference(const ModelSpec& model) {
  auto self = World().Split(World().rank(), 0);
  EXPECT_TRUE(self.ok());
  ParallelConfig one;
  one.dp = 1;
  return RunTrial(TestBackend(), *self, model, Train(), one, NumericOptions());
}

void ExpectClose(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 2e-5 * std::max(1.0, std::abs(want))) << what;
}

struct Case {
  const char* model;
  const char* spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " " << c.spec; }

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, LossAndUpdatedWeightsMatchOneRank) {
  const ModelSpec model = ModelPreset(GetParam().model);
  const TrialMeasurement ref = Reference(model);
  ASSERT_EQ(ref.outcome, Outcome::kOk) << ref.message;
  const ParallelConfig c = Complete(ParseSpec(GetParam().spec), World().size());
  const TrialMeasurement got = RunTrial(TestBackend(), World(), model, Train(), c, NumericOptions());
  ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
  ExpectClose(got.loss, ref.loss, "loss");
  ExpectClose(got.weight_sum, ref.weight_sum, "sum of the updated weights");
  ExpectClose(got.weight_projection, ref.weight_projection, "projection of the updated weights");
  // The step moved the weights: a reference that skipped the update would not match this.
  EXPECT_GT(std::abs(ref.loss - std::log(256.0)), 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Trial, Equivalence,
    ::testing::Values(Case{"tiny", "tp=2,dp=2"}, Case{"tiny", "tp=2,dp=2,sp=on"},
                      Case{"tiny", "pp=2,dp=2"}, Case{"tiny", "pp=2,dp=2,vpp=2"},
                      Case{"tiny", "pp=4,vpp=1,mbs=2"}, Case{"tiny", "tp=2,dp=2,dist_opt=on"},
                      Case{"tiny", "dp=4,dist_opt=on"}, Case{"tiny", "tp=2,pp=2,sp=on"},
                      Case{"tiny", "tp=2,pp=2,recompute=full"},
                      Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective"},
                      Case{"tiny", "pp=2,dp=2,recompute=full,recompute_layers=1"},
                      Case{"tiny-gpt", "tp=2,pp=2,sp=on"}, Case{"tiny-gpt", "pp=2,dp=2,vpp=2"}),
    [](const ::testing::TestParamInfo<Case>& param) {
      std::string name = std::string(param.param.model) + "_" + param.param.spec;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace autopar::trial

namespace autopar::trial {
namespace {

// The memory model of the CPU backend: fp32 training, nothing but the trial's own allocations.
double PredictedPeakGib(const ModelSpec& model, const ParallelConfig& c) {
  ClusterSpec cluster;
  cluster.nnodes = 1;
  cluster.gpus_per_node = c.world_size();
  cluster.gpu = GpuPreset("a100-80gb");
  PerfConstants k;
  k.mem.runtime_overhead_gib = 0;
  k.mem.fragmentation = 0;
  const CostModel cm(model, Train(), cluster, k);
  return cm.Memory(c).total() / (1024.0 * 1024.0 * 1024.0);
}

class Memory : public ::testing::TestWithParam<Case> {};

TEST_P(Memory, MeasuredPeakIsWithinTenPercentOfTheModel) {
  const ModelSpec model = ModelPreset(GetParam().model);
  const ParallelConfig c = Complete(ParseSpec(GetParam().spec), World().size());
  TrialOptions o = NumericOptions();
  o.fingerprint = false;
  const TrialMeasurement got = RunTrial(TestBackend(), World(), model, Train(), c, o);
  ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
  const double measured = *std::max_element(got.peak_memory_gib.begin(), got.peak_memory_gib.end());
  const double predicted = PredictedPeakGib(model, c);
  EXPECT_NEAR(measured / predicted, 1.0, 0.10)
      << "measured " << measured * 1024 << " MiB, predicted " << predicted * 1024 << " MiB";
  if (World().rank() == 0) {
    std::printf("memory %-10s %-36s measured %7.3f MiB  predicted %7.3f MiB  ratio %.3f\n",
                GetParam().model, GetParam().spec, measured * 1024, predicted * 1024,
                measured / predicted);
  }
}

// A configuration predicted not to fit fails with `oom` under the budget, on every rank, and the
// next trial in the same process runs normally.
TEST(TrialOutcome, OomIsAValueAndTheNextTrialSucceeds) {
  const ModelSpec model = ModelPreset("tiny");
  const ParallelConfig big = Complete(ParseSpec("dp=4"), World().size());
  const ParallelConfig small = Complete(ParseSpec("tp=2,pp=2,sp=on"), World().size());
  const double big_gib = PredictedPeakGib(model, big), small_gib = PredictedPeakGib(model, small);
  ASSERT_LT(small_gib * 1.2, big_gib * 0.8);
  backend::CpuBackendOptions options;
  options.memory_budget_bytes =
      static_cast<size_t>(0.5 * (small_gib + big_gib) * 1024 * 1024 * 1024);
  auto budgeted = backend::MakeCpuBackend(options);
  ASSERT_TRUE(budgeted.ok());
  TrialOptions o = NumericOptions();
  o.fingerprint = false;
  const TrialMeasurement oom = RunTrial(**budgeted, World(), model, Train(), big, o);
  EXPECT_EQ(oom.outcome, Outcome::kOom) << oom.message;
  EXPECT_EQ((*budgeted)->device().bytes_in_use(), 0u);
  const TrialMeasurement ok = RunTrial(**budgeted, World(), model, Train(), small, o);
  EXPECT_EQ(ok.outcome, Outcome::kOk) << ok.message;
  EXPECT_GT(ok.step_time_s, 0);
}

// Configurations the runner cannot express are `invalid` with the reason, on every rank.
TEST(TrialOutcome, UnsupportedIsInvalid) {
  const ParallelConfig c = Complete(ParseSpec("cp=2,dp=2"), World().size());
  const TrialMeasurement got =
      RunTrial(TestBackend(), World(), ModelPreset("tiny"), Train(), c, NumericOptions());
  EXPECT_EQ(got.outcome, Outcome::kInvalid);
  EXPECT_NE(got.message.find("context"), std::string::npos) << got.message;
}

INSTANTIATE_TEST_SUITE_P(
    Trial, Memory,
    ::testing::Values(Case{"tiny", "dp=4"}, Case{"tiny", "tp=2,dp=2"},
                      Case{"tiny", "tp=2,dp=2,sp=on"}, Case{"tiny", "pp=2,dp=2"},
                      Case{"tiny", "pp=2,dp=2,vpp=2"}, Case{"tiny", "tp=2,dp=2,dist_opt=on"},
                      Case{"tiny", "tp=2,pp=2,recompute=full"},
                      Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective"},
                      Case{"tiny-gpt", "tp=2,pp=2,sp=on"}),
    [](const ::testing::TestParamInfo<Case>& param) {
      std::string name = std::string(param.param.model) + "_" + param.param.spec;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

}  // namespace
}  // namespace autopar::trial
