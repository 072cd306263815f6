// Data-parallel overlap (issue 10, item 5): for each setting of the knobs, the analytic model,
// the trial and the emitted Megatron flags tell the same story — which collectives overlap, and
// in how many buckets.
#include <gtest/gtest.h>

#include <string>

#include "autopar/cli/plan_format.h"
#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "autopar/trial/trial.h"
#include "mpi_env.h"
#include "trial_setup.h"

namespace autopar::trial {
namespace {

using device::Outcome;
using device::testing::TestPlatform;
using device::testing::World;

// Megatron's --ddp-bucket-size, small enough for several buckets of the tiny model.
constexpr int64_t kBucket = 20000;

bool Has(const std::string& flags, const std::string& flag) {
  return (flags + " ").find(" " + flag + " ") != std::string::npos;
}

TEST(DpOverlapAgreement, ModelTrialAndMegatronFlagsAgree) {
  const ModelSpec model = ModelPreset("tiny");
  const TrainSpec train = testing::SmallTrain(Precision::kFP32);
  ClusterSpec cluster;
  cluster.nnodes = 1;
  cluster.gpus_per_node = World().size();
  cluster.gpu = GpuPreset("a100-80gb");
  PerfConstants k = DefaultConstants("cpu");
  k.stack.ddp_bucket_size = kBucket;
  const CostModel cost(model, train, cluster, k);
  TrialOptions options = testing::NumericOptions();
  options.fingerprint = false;
  options.ddp_bucket_size = kBucket;

  for (const char* spec :
       {"dp=4", "dp=4,overlap_grad_reduce=off", "dp=4,dist_opt=on",
        "dp=4,dist_opt=on,overlap_param_gather=off", "dp=4,dist_opt=on,overlap_grad_reduce=off",
        "tp=2,dp=2,dist_opt=on", "tp=2,dp=2,dist_opt=on,overlap_grad_reduce=off"}) {
    SCOPED_TRACE(spec);
    const ParallelConfig c = Complete(ParseSpec(spec), World().size());
    const TimeBreakdown t = cost.Time(c);
    const TrialMeasurement trial = RunTrial(TestPlatform(), World(), model, train, c, options);
    ASSERT_EQ(trial.outcome, Outcome::kOk) << trial.message;
    const std::string flags = cli::MegatronFlags(c, model, train);

    // Gradient reduction: the flag, the model's buckets and the trial's agree.
    const bool grad = Has(flags, "--overlap-grad-reduce");
    EXPECT_EQ(grad, c.overlap_grad_reduce) << flags;
    EXPECT_EQ(t.grad_reduce_buckets > 0, grad);
    EXPECT_EQ(trial.grad_buckets_overlapped > 0, grad);
    EXPECT_EQ(trial.grad_buckets_overlapped, t.grad_reduce_buckets)
        << "the trial's buckets (Megatron's greedy over its layout) vs the model's";
    // Parameter all-gather, likewise; Megatron refuses it without the distributed optimizer and
    // --overlap-grad-reduce, and so do the space, the model and the trial.
    const bool gather = Has(flags, "--overlap-param-gather");
    EXPECT_EQ(gather, c.overlap_param_gather) << flags;
    EXPECT_EQ(t.param_gather_buckets > 0, gather);
    EXPECT_EQ(trial.param_buckets_overlapped > 0, gather);
    EXPECT_EQ(trial.param_buckets_overlapped, t.param_gather_buckets);
    EXPECT_TRUE(!gather || (grad && Has(flags, "--use-distributed-optimizer"))) << flags;
    // Exposure: with the knobs off the model shows every second of DP communication; with them on
    // and several buckets, less.
    if (!grad) {
      EXPECT_DOUBLE_EQ(t.features[kDpComm], t.dp_comm_s);
    } else {
      EXPECT_GT(t.grad_reduce_buckets, 1);
      EXPECT_LT(t.features[kDpComm], t.dp_comm_s);
    }
    // fp32 reduction: Megatron's default, no flag.
    EXPECT_FALSE(Has(flags, "--grad-reduce-in-bf16"));
  }
}

}  // namespace
}  // namespace autopar::trial
