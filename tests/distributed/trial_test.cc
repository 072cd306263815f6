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
