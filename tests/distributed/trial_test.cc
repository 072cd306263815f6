// The proof that a trial is real: one step of a small model gives the same loss and the same
// updated weights on one rank and under every distributed layout (fp32, CPU platform).
#include "autopar/trial/trial.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "kernels/init.h"
#include "mpi_env.h"
#include "src/trial/moe.h"
#include "trial_setup.h"

namespace autopar::trial {
namespace {

using device::Outcome;
using device::testing::TestPlatform;
using device::testing::World;

using testing::NumericOptions;

TrainSpec Train() { return testing::SmallTrain(Precision::kFP32); }

// The single-rank reference: every rank runs it alone on a group of its own.
TrialMeasurement Reference(const ModelSpec& model, const TrialOptions& options = NumericOptions()) {
  auto self = World().Split(World().rank(), 0);
  EXPECT_TRUE(self.ok());
  ParallelConfig one;
  one.dp = 1;
  return RunTrial(TestPlatform(), *self, model, Train(), one, options);
}

void ExpectClose(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 2e-5 * std::max(1.0, std::abs(want))) << what;
}

struct Case {
  const char* model;
  const char* spec;
  // The preset with this many transformer layers instead of its own (0: the preset's), for
  // uneven pipeline stages that the 4 layers of the tiny presets cannot hold.
  int64_t num_layers = 0;
  bool qk_layernorm = false;  // the preset with Megatron-core's --qk-layernorm
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << c.spec;
  if (c.num_layers > 0) *os << " with " << c.num_layers << " layers";
  if (c.qk_layernorm) *os << " with qk-layernorm";
}

ModelSpec ModelOf(const Case& c) {
  ModelSpec m = ModelPreset(c.model);
  if (c.num_layers > 0) m.num_layers = c.num_layers;
  m.qk_layernorm = c.qk_layernorm;
  return m;
}

// A test name from the case: "tiny_tp_2_dp_2", "tiny_6_layers_pp_4_pp_first_1_pp_last_1".
std::string CaseName(const ::testing::TestParamInfo<Case>& param) {
  std::string name = std::string(param.param.model) + "_";
  if (param.param.num_layers > 0) name += std::to_string(param.param.num_layers) + "_layers_";
  if (param.param.qk_layernorm) name += "qk_layernorm_";
  name += param.param.spec;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

// The case's loss, updated weights and load-balancing loss against one rank's.
void ExpectMatchesOneRank(const Case& param, const TrialOptions& options) {
  const ModelSpec model = ModelOf(param);
  const TrialMeasurement ref = Reference(model, options);
  ASSERT_EQ(ref.outcome, Outcome::kOk) << ref.message;
  const ParallelConfig c = Complete(ParseSpec(param.spec), World().size());
  const TrialMeasurement got = RunTrial(TestPlatform(), World(), model, Train(), c, options);
  ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
  ExpectClose(got.loss, ref.loss, "loss");
  ExpectClose(got.weight_sum, ref.weight_sum, "sum of the updated weights");
  ExpectClose(got.weight_projection, ref.weight_projection, "projection of the updated weights");
  ExpectClose(got.aux_loss, ref.aux_loss, "load-balancing loss");
  // The step moved the weights: a reference that skipped the update would not match this.
  EXPECT_GT(std::abs(ref.loss - std::log(256.0)), 0.0);
  if (model.is_moe()) {
    EXPECT_GT(ref.aux_loss, 0.0);
  }
}

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, LossAndUpdatedWeightsMatchOneRank) {
  ExpectMatchesOneRank(GetParam(), NumericOptions());
}

// MoE cases route by random logits there (TrialOptions::moe_force_load_balancing); by the
// router's own logits too, the layouts agree.
class LearnedRouterEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(LearnedRouterEquivalence, LossAndUpdatedWeightsMatchOneRank) {
  TrialOptions o = NumericOptions();
  o.moe_force_load_balancing = false;
  ExpectMatchesOneRank(GetParam(), o);
}

INSTANTIATE_TEST_SUITE_P(Trial, LearnedRouterEquivalence,
                         ::testing::Values(Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on"},
                                           Case{"tiny-moe", "cp=2,dp=2,ep=4,dispatcher=flex"},
                                           Case{"tiny-moe", "pp=2,dp=2,ep=2,recompute=full"}),
                         CaseName);

INSTANTIATE_TEST_SUITE_P(
    Trial, Equivalence,
    ::testing::Values(
        Case{"tiny", "tp=2,dp=2"}, Case{"tiny", "tp=2,dp=2,sp=on"}, Case{"tiny", "pp=2,dp=2"},
        Case{"tiny", "pp=2,dp=2,vpp=2"}, Case{"tiny", "pp=4,vpp=1,mbs=2"},
        Case{"tiny", "tp=2,dp=2,dist_opt=on"}, Case{"tiny", "dp=4,dist_opt=on"},
        Case{"tiny", "tp=2,pp=2,sp=on"}, Case{"tiny", "tp=2,pp=2,recompute=full"},
        Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective"},
        Case{"tiny", "pp=2,dp=2,recompute=full,recompute_layers=1"},
        Case{"tiny-gpt", "tp=2,pp=2,sp=on"}, Case{"tiny-gpt", "pp=2,dp=2,vpp=2"},
        // Context parallel (zig-zag ring), Ulysses, and both, with tp, SP,
        // recompute, the distributed optimizer and pipelines; kv heads replicated
        // when up exceeds them (tiny has 2 kv heads).
        Case{"tiny", "cp=2,dp=2"}, Case{"tiny", "up=2,dp=2"}, Case{"tiny", "tp=2,cp=2"},
        Case{"tiny", "tp=2,up=2"}, Case{"tiny", "cp=2,up=2"}, Case{"tiny", "cp=4"},
        Case{"tiny", "up=4"}, Case{"tiny", "tp=2,cp=2,sp=on"}, Case{"tiny", "tp=2,up=2,sp=on"},
        Case{"tiny", "cp=2,dp=2,mbs=2,dist_opt=on"}, Case{"tiny", "cp=2,dp=2,recompute=selective"},
        Case{"tiny", "up=2,dp=2,recompute=selective"}, Case{"tiny", "cp=2,pp=2,recompute=full"},
        Case{"tiny", "up=2,pp=2,vpp=2,recompute=full"}, Case{"tiny-gpt", "cp=2,up=2"},
        // Context parallel by all-gathered K and V (Megatron's --cp-comm-type
        // all_gather): alone, over four ranks, with tp and SP, micro-batches of
        // two and the distributed optimizer, recompute, a pipeline.
        Case{"tiny", "cp=2,dp=2,cp_comm=allgather"}, Case{"tiny", "cp=4,cp_comm=allgather"},
        Case{"tiny", "tp=2,cp=2,sp=on,cp_comm=allgather"},
        Case{"tiny", "cp=2,dp=2,mbs=2,dist_opt=on,cp_comm=allgather"},
        Case{"tiny", "cp=2,dp=2,recompute=selective,cp_comm=allgather"},
        Case{"tiny", "cp=2,pp=2,recompute=full,cp_comm=allgather"},
        Case{"tiny-gpt", "cp=2,dp=2,cp_comm=allgather"},
        // Dropless MoE with expert parallelism (tiny-moe: 4 experts top-2, a shared
        // expert, one dense first layer).
        Case{"tiny-moe", "dp=4,ep=2"}, Case{"tiny-moe", "dp=4,ep=4"},
        Case{"tiny-moe", "tp=2,dp=2,ep=2"}, Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on"},
        Case{"tiny-moe", "cp=2,dp=2,ep=4"}, Case{"tiny-moe", "up=2,dp=2,ep=2"},
        Case{"tiny-moe", "pp=2,dp=2,ep=2"}, Case{"tiny-moe", "dp=4,ep=4,dist_opt=on"},
        Case{"tiny-moe", "dp=4,ep=2,mbs=2,recompute=full"},
        Case{"tiny-moe", "tp=2,pp=2,sp=on,recompute=selective"},
        // Expert tensor parallel other than tp (MoE parallel folding): etp = 1
        // with tp = 2 puts both tp ranks in one ep group (the same layout as
        // tp=2,dp=2,ep=2,sp=on above, at etp = 2), or spreads experts over all
        // four ranks, or replicates them everywhere; etp = 2 at tp = 1 all-gathers
        // over two dp ranks.
        Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on,etp=1"},
        Case{"tiny-moe", "tp=2,dp=2,ep=4,sp=on,etp=1"}, Case{"tiny-moe", "tp=2,dp=2,sp=on,etp=1"},
        Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on,etp=1,dist_opt=on"},
        Case{"tiny-moe", "tp=2,pp=2,sp=on,etp=1,recompute=full"},
        Case{"tiny-moe", "dp=4,ep=2,etp=2"}, Case{"tiny-moe", "dp=4,etp=2,dist_opt=on"},
        // Data-parallel overlap off (on is the default of the cases above).
        Case{"tiny", "dp=4,overlap_grad_reduce=off"},
        Case{"tiny", "tp=2,dp=2,dist_opt=on,overlap_param_gather=off"},
        Case{"tiny-moe", "dp=4,ep=4,dist_opt=on,overlap_grad_reduce=off"},
        // Uneven pipeline stages (pp_first/pp_last): each rank builds, runs and
        // updates its stage's layers at Megatron-core's global indices. 1F1B with
        // 1+3, 1+2+2+1 and 1+1+1+3 layers; interleaved with 2+4 layers (chunks of
        // 1 and 2: stage 0 holds layers 0 and 3, stage 1 layers 1-2 and 4-5);
        // block recompute of the first layer of each chunk; tiny-moe's dense layer
        // 0 alone on the first stage, and its MoE layers 4+2 interleaved.
        Case{"tiny", "pp=2,dp=2,pp_first=1"}, Case{"tiny", "pp=4,pp_first=1,pp_last=1", 6},
        Case{"tiny", "pp=2,dp=2,vpp=2,pp_first=2", 6},
        Case{"tiny", "pp=2,vpp=2,pp_first=2,recompute=full,recompute_layers=1", 6},
        Case{"tiny", "pp=4,pp_last=3,recompute=full,recompute_layers=1", 6},
        Case{"tiny-gpt", "tp=2,pp=2,sp=on,pp_last=1"},
        Case{"tiny-moe", "pp=2,dp=2,ep=2,pp_first=1"},
        Case{"tiny-moe", "pp=2,dp=2,ep=2,vpp=2,pp_last=2", 6}),
    CaseName);

// Megatron-core's --qk-layernorm (Qwen3, Gemma-3): each tp rank normalizes its own query and key
// heads, with weights replicated over tp whose gradients are summed over it whatever SP; RMSNorm
// (tiny, tiny-moe) and LayerNorm (tiny-gpt); under the ring, Ulysses (before its all-to-all),
// full and selective recompute, pipelines. The norms' gradients are small at these weights, so
// the step is a hundred times larger than NumericOptions' for the updated norms to show in the
// fingerprints (a tp rank that kept its partial gradient fails every tp case).
class QkLayernormEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(QkLayernormEquivalence, LossAndUpdatedWeightsMatchOneRank) {
  TrialOptions o = NumericOptions();
  o.learning_rate = 1.0f;
  ExpectMatchesOneRank(GetParam(), o);
}

INSTANTIATE_TEST_SUITE_P(Trial, QkLayernormEquivalence,
                         ::testing::Values(Case{"tiny", "tp=2,dp=2", 0, true},
                                           Case{"tiny", "tp=2,pp=2,sp=on", 0, true},
                                           Case{"tiny-gpt", "tp=2,dp=2,sp=on", 0, true},
                                           Case{"tiny", "cp=2,up=2", 0, true},
                                           Case{"tiny", "tp=2,up=2", 0, true},
                                           Case{"tiny", "tp=2,pp=2,recompute=full", 0, true},
                                           Case{"tiny", "up=2,dp=2,recompute=selective", 0, true},
                                           Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on", 0, true}),
                         CaseName);

// The gradient every layout's update follows against central differences of the loss, end to end:
// the layouts' equivalence cannot see a wrong gradient they all share (a backward wired to the
// wrong tensor, a missing term). One step of Adam with a large epsilon moves the weights by
// -lr·g/eps (to within |g|/eps), so the fingerprint's projection falls by lr/eps times the
// directional derivative of the loss along the projection's direction p; the loss at the weights
// moved by ±δ·p (TrialOptions::weight_perturbation) gives the same derivative by differences,
// at two δ extrapolated to zero (Richardson: the fp32 loss's rounding bounds δ below, the
// curvature along p above). Dense models: a MoE layer's routing moves with the weights (its
// gradient is MoeGradient's), and under forced balance Megatron's RandomSTE passes the router a
// gradient of logits the loss does not depend on.
class GradientAlongTheFingerprint : public ::testing::TestWithParam<Case> {};

TEST_P(GradientAlongTheFingerprint, MatchesCentralDifferencesOfTheLoss) {
  const ModelSpec model = ModelOf(GetParam());
  ASSERT_FALSE(model.is_moe());
  const ParallelConfig c = Complete(ParseSpec(GetParam().spec), World().size());
  constexpr float kLr = 1000.0f, kEps = 1e5f;
  auto run = [&](float lr, double perturbation) {
    TrialOptions o = NumericOptions();
    o.timed_iterations = 1;
    o.learning_rate = lr;
    o.adam_eps = kEps;
    o.weight_perturbation = perturbation;
    TrialMeasurement m = RunTrial(TestPlatform(), World(), model, Train(), c, o);
    EXPECT_EQ(m.outcome, Outcome::kOk) << m.message;
    return m;
  };
  const double analytic =
      (run(0.0f, 0.0).weight_projection - run(kLr, 0.0).weight_projection) * kEps / kLr;
  auto difference = [&](double delta) {
    return (run(0.0f, delta).loss - run(0.0f, -delta).loss) / (2 * delta);
  };
  const double wide = difference(4e-4), narrow = difference(2e-4);
  const double numeric = (4 * narrow - wide) / 3;
  EXPECT_NEAR(analytic, numeric, 1e-3 * std::abs(numeric) + 2e-5);
  EXPECT_GT(std::abs(numeric), 1e-2);  // a derivative the check can see
  if (World().rank() == 0) {
    std::printf("gradient along the fingerprint %-8s %-32s analytic %+.6f  numeric %+.6f\n",
                GetParam().model, GetParam().spec, analytic, numeric);
  }
}

INSTANTIATE_TEST_SUITE_P(Trial, GradientAlongTheFingerprint,
                         ::testing::Values(Case{"tiny", "dp=4"}, Case{"tiny-gpt", "dp=4"},
                                           Case{"tiny", "tp=2,dp=2,sp=on,recompute=selective"},
                                           Case{"tiny", "pp=2,dp=2,vpp=2,recompute=full"},
                                           Case{"tiny", "tp=2,dp=2", 0, true},
                                           Case{"tiny-gpt", "tp=2,pp=2,sp=on", 0, true},
                                           Case{"tiny", "cp=2,up=2", 0, true}),
                         CaseName);

// The norms change the step: a layout that skipped them could not match the reference above.
TEST(TrialQkLayernorm, ChangesTheLossAndTheUpdate) {
  ModelSpec with = ModelPreset("tiny");
  with.qk_layernorm = true;
  const TrialMeasurement plain = Reference(ModelPreset("tiny")), normed = Reference(with);
  ASSERT_EQ(plain.outcome, Outcome::kOk) << plain.message;
  ASSERT_EQ(normed.outcome, Outcome::kOk) << normed.message;
  EXPECT_GT(std::abs(normed.loss - plain.loss), 1e-4 * std::abs(plain.loss));
  EXPECT_GT(std::abs(normed.weight_projection - plain.weight_projection),
            1e-4 * std::abs(plain.weight_projection));
}

// Selective recompute of other modules (Megatron's --recompute-modules): the norms, a dense MLP, a
// MoE layer whole (its dispatch rerun), the routed experts' activation, the shared experts; with
// SP, the ring and Ulysses, pipelines and virtual stages.
INSTANTIATE_TEST_SUITE_P(
    TrialRecomputeModules, Equivalence,
    ::testing::Values(
        Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective,recompute_modules=layernorm+mlp"},
        Case{"tiny", "cp=2,up=2,recompute=selective,recompute_modules=layernorm"},
        Case{"tiny", "dp=4,recompute=selective,recompute_modules=core_attn+layernorm+mlp"},
        Case{"tiny-moe",
             "tp=2,dp=2,ep=2,sp=on,recompute=selective,recompute_modules=layernorm+moe"},
        Case{"tiny-moe", "dp=4,ep=2,recompute=selective,recompute_modules=moe_act+shared_experts"},
        Case{"tiny-moe",
             "pp=2,dp=2,ep=2,vpp=2,recompute=selective,recompute_modules=layernorm+mlp+moe+moe_"
             "act"}),
    CaseName);

// Megatron's flex dispatcher (DeepEP and its kin): a token's row travels once to each rank holding
// its experts and the gates are applied beside them; ep over dp, over tp and dp with etp = 1,
// etp > 1 (rows and gates all-gathered, sums reduce-scattered), etp alone, the MoE layer rerun
// (its dispatch again), moe_act, full recompute, pipelines with virtual stages.
INSTANTIATE_TEST_SUITE_P(
    TrialFlexDispatcher, Equivalence,
    ::testing::Values(
        Case{"tiny-moe", "dp=4,ep=2,dispatcher=flex"},
        Case{"tiny-moe", "dp=4,ep=4,dispatcher=flex"},
        Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on,dispatcher=flex"},
        Case{"tiny-moe", "tp=2,dp=2,ep=4,sp=on,etp=1,dispatcher=flex"},
        Case{"tiny-moe", "dp=4,ep=2,etp=2,dispatcher=flex"},
        Case{"tiny-moe", "dp=4,etp=2,dispatcher=flex,dist_opt=on"},
        Case{"tiny-moe", "cp=2,dp=2,ep=4,dispatcher=flex"},
        Case{"tiny-moe",
             "tp=2,dp=2,ep=2,sp=on,dispatcher=flex,recompute=selective,recompute_modules=layernorm+"
             "moe"},
        Case{"tiny-moe",
             "pp=2,dp=2,ep=2,vpp=2,dispatcher=flex,recompute=selective,recompute_modules=moe_act"},
        Case{"tiny-moe", "dp=4,ep=2,mbs=2,dispatcher=flex,recompute=full"}),
    CaseName);

// Data-parallel overlap (ParallelConfig's overlap_grad_reduce / overlap_param_gather): the
// bucketed reductions under the backward pass and the gathers under the next forward reorder
// when the collectives run, not what they sum, so every knob setting gives the same numbers. A
// small bucket (Megatron's --ddp-bucket-size) gives the tiny models several buckets.
constexpr int64_t kSmallBucket = 20000;

class OverlapOnAndOff : public ::testing::TestWithParam<Case> {};

TEST_P(OverlapOnAndOff, SameLossAndWeightsWithEveryKnobSetting) {
  const ModelSpec model = ModelOf(GetParam());
  const std::string base = GetParam().spec;
  const ParallelConfig on = Complete(ParseSpec(base), World().size());
  TrialOptions o = NumericOptions();
  o.ddp_bucket_size = kSmallBucket;
  const TrialMeasurement ref = RunTrial(TestPlatform(), World(), model, Train(), on, o);
  ASSERT_EQ(ref.outcome, Outcome::kOk) << ref.message;
  // On really overlapped: several buckets started under the first stage's backward.
  EXPECT_GT(ref.grad_buckets_overlapped, on.pp == 1 ? 1 : 0);
  EXPECT_EQ(ref.param_buckets_overlapped > 0, on.overlap_param_gather);
  std::vector<std::string> others = {base + ",overlap_grad_reduce=off"};
  if (on.dist_opt) others.push_back(base + ",overlap_param_gather=off");
  for (const std::string& spec : others) {
    const ParallelConfig c = Complete(ParseSpec(spec), World().size());
    const TrialMeasurement got = RunTrial(TestPlatform(), World(), model, Train(), c, o);
    ASSERT_EQ(got.outcome, Outcome::kOk) << spec << ": " << got.message;
    EXPECT_EQ(got.grad_buckets_overlapped > 0, c.overlap_grad_reduce) << spec;
    EXPECT_EQ(got.param_buckets_overlapped, 0) << spec;
    EXPECT_EQ(got.loss, ref.loss) << spec;
    EXPECT_EQ(got.aux_loss, ref.aux_loss) << spec;
    EXPECT_EQ(got.weight_sum, ref.weight_sum) << spec;
    EXPECT_EQ(got.weight_projection, ref.weight_projection) << spec;
  }
  // And Megatron's default bucket (one for these models) too.
  const TrialMeasurement one_bucket =
      RunTrial(TestPlatform(), World(), model, Train(), on, NumericOptions());
  ASSERT_EQ(one_bucket.outcome, Outcome::kOk) << one_bucket.message;
  EXPECT_EQ(one_bucket.weight_sum, ref.weight_sum);
  EXPECT_EQ(one_bucket.weight_projection, ref.weight_projection);
}

INSTANTIATE_TEST_SUITE_P(
    Trial, OverlapOnAndOff,
    ::testing::Values(
        Case{"tiny", "dp=4"}, Case{"tiny", "dp=4,dist_opt=on"},
        Case{"tiny", "tp=2,dp=2,sp=on,dist_opt=on"}, Case{"tiny", "cp=2,dp=2,dist_opt=on"},
        Case{"tiny", "pp=2,dp=2"}, Case{"tiny", "pp=2,dp=2,vpp=2,dist_opt=on"},
        Case{"tiny", "pp=2,dp=2,dist_opt=on,recompute=full"}, Case{"tiny-gpt", "pp=2,dp=2"},
        Case{"tiny-gpt", "dp=4,dist_opt=on"}, Case{"tiny-moe", "dp=4,ep=2,dist_opt=on"},
        Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on"}, Case{"tiny", "pp=2,dp=2,pp_first=3,dist_opt=on"},
        Case{"tiny", "pp=2,dp=2,vpp=2,pp_first=4,dist_opt=on", 6},
        Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on,dist_opt=on", 2}),
    CaseName);

}  // namespace
}  // namespace autopar::trial

namespace autopar::trial {
namespace {

// The memory model of the CPU platform: fp32 training, nothing but the trial's own allocations.
double PredictedPeakGib(const ModelSpec& model, const ParallelConfig& c,
                        const TrainSpec& train = Train(), bool dropout = false) {
  ClusterSpec cluster;
  cluster.nnodes = 1;
  cluster.gpus_per_node = c.world_size();
  cluster.gpu = GpuPreset("a100-80gb");
  PerfConstants k;
  k.mem.runtime_overhead_gib = 0;
  k.mem.fragmentation = 0;
  k.stack.dropout = dropout;
  const CostModel cm(model, train, cluster, k);
  return cm.Memory(c).total() / (1024.0 * 1024.0 * 1024.0);
}

class Memory : public ::testing::TestWithParam<Case> {
 protected:
  void Check(const TrainSpec& train) {
    const ModelSpec model = ModelOf(GetParam());
    const ParallelConfig c = Complete(ParseSpec(GetParam().spec), World().size());
    TrialOptions o = NumericOptions();
    o.fingerprint = false;
    const TrialMeasurement got = RunTrial(TestPlatform(), World(), model, train, c, o);
    ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
    const double measured =
        *std::max_element(got.peak_memory_gib.begin(), got.peak_memory_gib.end());
    const double predicted = PredictedPeakGib(model, c, train);
    EXPECT_NEAR(measured / predicted, 1.0, 0.10)
        << "measured " << measured * 1024 << " MiB, predicted " << predicted * 1024 << " MiB";
    if (World().rank() == 0) {
      std::printf("memory %-10s %-5lld %-36s measured %7.3f MiB  predicted %7.3f MiB  ratio %.3f\n",
                  GetParam().model, static_cast<long long>(train.seq_length), GetParam().spec,
                  measured * 1024, predicted * 1024, measured / predicted);
    }
  }
};

TEST_P(Memory, MeasuredPeakIsWithinTenPercentOfTheModel) { Check(Train()); }

// Long sequences, where activations and the sequence-split attention's and MoE dispatch's buffers
// outweigh the parameters of the tiny models.
class MemoryLongSequence : public Memory {};
TEST_P(MemoryLongSequence, MeasuredPeakIsWithinTenPercentOfTheModel) {
  TrainSpec t = Train();
  t.global_batch_size = 4;
  t.seq_length = 1024;
  Check(t);
}

// A configuration predicted not to fit fails with `oom` under the budget, on every rank, and the
// next trial in the same process runs normally.
TEST(TrialOutcome, OomIsAValueAndTheNextTrialSucceeds) {
  const ModelSpec model = ModelPreset("tiny");
  const ParallelConfig big = Complete(ParseSpec("dp=4"), World().size());
  const ParallelConfig small = Complete(ParseSpec("tp=2,pp=2,sp=on"), World().size());
  const double big_gib = PredictedPeakGib(model, big), small_gib = PredictedPeakGib(model, small);
  ASSERT_LT(small_gib * 1.2, big_gib * 0.8);
  device::CpuPlatformOptions options = device::testing::TestPlatformOptions();
  options.memory_budget_bytes =
      static_cast<size_t>(0.5 * (small_gib + big_gib) * 1024 * 1024 * 1024);
  auto budgeted = device::MakeCpuPlatform(options);
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

// A short step is timed more often when min_timed_s asks for it, and every rank agrees on the
// count (the per-iteration maxima would not line up otherwise). A minimum no run of the tiny
// model comes near takes the cap, however loaded the machine is; the count below the cap is
// ExtraTimedIterations' arithmetic (Trial.ExtraTimedIterations*). The cap's iterations are the
// cheapest step of 4 ranks (dp=4, one micro-batch): at tp=2,pp=2 they took 50 s of
// distributed_test_np4 on a loaded two-core machine.
TEST(TrialTiming, ShortStepsAreTimedUntilTheMinimumTime) {
  const ParallelConfig c = Complete(ParseSpec("dp=4"), World().size());
  TrialOptions o;
  o.warmup_iterations = 1;
  o.timed_iterations = 2;
  o.max_microbatches = 1;
  const TrialMeasurement few =
      RunTrial(TestPlatform(), World(), ModelPreset("tiny"), Train(), c, o);
  ASSERT_EQ(few.outcome, Outcome::kOk) << few.message;
  EXPECT_EQ(few.iteration_times_s.size(), 2u);
  o.min_timed_s = 1e6;
  const TrialMeasurement more =
      RunTrial(TestPlatform(), World(), ModelPreset("tiny"), Train(), c, o);
  ASSERT_EQ(more.outcome, Outcome::kOk) << more.message;
  EXPECT_EQ(more.iteration_times_s.size(), static_cast<size_t>(kMaxTimedIterations));
  int counts[2] = {static_cast<int>(more.iteration_times_s.size()), 0};
  counts[1] = -counts[0];
  ASSERT_EQ(MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, World().comm()), MPI_SUCCESS);
  EXPECT_EQ(counts[0], -counts[1]);  // max = min over ranks
}

// Configurations the runner cannot express are `invalid` with the reason, on every rank.
TEST(TrialOutcome, UnsupportedIsInvalid) {
  const ParallelConfig c = Complete(ParseSpec("cp=2,dp=2"), World().size());
  ModelSpec mla = ModelPreset("tiny");
  mla.kv_lora_rank = 16;
  const TrialMeasurement got = RunTrial(TestPlatform(), World(), mla, Train(), c, NumericOptions());
  EXPECT_EQ(got.outcome, Outcome::kInvalid);
  EXPECT_NE(got.message.find("latent"), std::string::npos) << got.message;
}

// A split of the layers the stages cannot hold (Megatron-core's rules, StageSplitError) is
// `invalid`, naming the key.
TEST(TrialOutcome, ImpossibleStageSplitIsInvalid) {
  for (const char* spec : {"pp=2,dp=2,pp_first=5", "pp=2,dp=2,vpp=2,pp_first=1"}) {
    const ParallelConfig c = Complete(ParseSpec(spec), World().size());
    const TrialMeasurement got =
        RunTrial(TestPlatform(), World(), ModelPreset("tiny"), Train(), c, NumericOptions());
    EXPECT_EQ(got.outcome, Outcome::kInvalid) << spec;
    EXPECT_NE(got.message.find("pp_first"), std::string::npos) << got.message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Trial, Memory,
    ::testing::Values(
        Case{"tiny", "dp=4"}, Case{"tiny", "tp=2,dp=2"}, Case{"tiny", "tp=2,dp=2,sp=on"},
        Case{"tiny", "pp=2,dp=2"}, Case{"tiny", "pp=2,dp=2,vpp=2"},
        Case{"tiny", "tp=2,dp=2,dist_opt=on"}, Case{"tiny", "tp=2,pp=2,recompute=full"},
        Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective"}, Case{"tiny-gpt", "tp=2,pp=2,sp=on"},
        Case{"tiny", "cp=2,dp=2"}, Case{"tiny", "up=2,dp=2"}, Case{"tiny", "tp=2,cp=2"},
        Case{"tiny", "tp=2,up=2"}, Case{"tiny", "cp=2,up=2,recompute=selective"},
        Case{"tiny-moe", "dp=4,ep=2"}, Case{"tiny-moe", "dp=4,ep=4"},
        Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on"}, Case{"tiny-moe", "dp=4,ep=4,dist_opt=on"},
        Case{"tiny-moe", "tp=2,dp=2,ep=4,sp=on,etp=1"}, Case{"tiny-moe", "dp=4,ep=2,etp=2"},
        // Uneven stages: the peak is the most loaded stage's (the model costs
        // each stage from its own layers).
        Case{"tiny", "pp=4,pp_first=1,pp_last=3", 6}, Case{"tiny", "pp=2,dp=2,pp_first=1", 6},
        Case{"tiny", "pp=2,dp=2,vpp=2,pp_first=2", 6},
        // qk-layernorm keeps the norm's input and statistics.
        Case{"tiny", "tp=2,dp=2", 0, true}, Case{"tiny-gpt", "tp=2,pp=2,sp=on", 0, true}),
    CaseName);

INSTANTIATE_TEST_SUITE_P(Trial, MemoryLongSequence,
                         ::testing::Values(Case{"tiny", "dp=4"}, Case{"tiny", "cp=4"},
                                           Case{"tiny", "up=4"}, Case{"tiny", "tp=2,cp=2,sp=on"},
                                           Case{"tiny", "cp=2,up=2,recompute=selective"},
                                           Case{"tiny", "tp=2,up=2,recompute=full"},
                                           Case{"tiny-moe", "dp=4,ep=4"},
                                           Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on"},
                                           Case{"tiny-moe", "cp=2,dp=2,ep=2"},
                                           Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on,etp=1"},
                                           Case{"tiny", "pp=4,pp_first=1,pp_last=3", 6},
                                           Case{"tiny", "tp=2,up=2", 0, true}),
                         CaseName);

// The embedding and the loss counted in the split of virtual stages (Megatron's
// --account-for-embedding/loss-in-pipeline-split): the first chunk of the first stage and the
// last chunk of the last stage hold a layer fewer; with MoE layers and block recompute.
INSTANTIATE_TEST_SUITE_P(
    TrialCountedSplit, Equivalence,
    ::testing::Values(
        Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on", 6},
        Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on", 7},
        // Chunks of one layer: the very first holds the embedding alone and the very last the
        // loss alone (Llama 3 405B's layout; Megatron-core builds a chunk of no layers).
        Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on", 2},
        Case{"tiny", "pp=2,dp=2,vpp=3,split_embedding=on", 5},
        Case{"tiny", "pp=2,dp=2,vpp=3,split_embedding=on,split_loss=on"},
        Case{"tiny-moe", "pp=2,dp=2,ep=2,vpp=2,split_loss=on", 7},
        Case{"tiny",
             "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on,recompute=full,recompute_layers=1",
             10}),
    CaseName);
INSTANTIATE_TEST_SUITE_P(
    TrialCountedSplit, Memory,
    ::testing::Values(Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on", 10},
                      // Chunks of one layer: the first stage's first and the last stage's
                      // last chunk keep their input alone.
                      Case{"tiny", "pp=2,dp=2,vpp=2,split_embedding=on,split_loss=on", 2},
                      Case{"tiny", "pp=2,dp=2,vpp=3,split_embedding=on,split_loss=on", 4},
                      Case{"tiny", "pp=2,dp=2,vpp=2,split_loss=on", 7}),
    CaseName);

// Selective recompute's other modules keep less (--recompute-modules).
INSTANTIATE_TEST_SUITE_P(
    TrialRecomputeModules, Memory,
    ::testing::Values(
        Case{"tiny", "tp=2,pp=2,sp=on,recompute=selective,recompute_modules=layernorm+mlp"},
        Case{"tiny-moe",
             "tp=2,dp=2,ep=2,sp=on,recompute=selective,recompute_modules=layernorm+moe"},
        Case{"tiny-moe", "dp=4,ep=2,recompute=selective,recompute_modules=moe_act+shared_experts"}),
    CaseName);
INSTANTIATE_TEST_SUITE_P(TrialRecomputeModules, MemoryLongSequence,
                         ::testing::Values(Case{"tiny-moe",
                                                "tp=2,dp=2,ep=2,sp=on,recompute=selective,"
                                                "recompute_modules=layernorm+moe"}),
                         CaseName);

// tiny-moe at 1,024 tokens (a long sequence for it): the trial's measured peak over the ranks and
// the model's, in GiB.
std::pair<double, double> MoePeaks(const std::string& spec) {
  const ModelSpec model = ModelPreset("tiny-moe");
  TrainSpec train = Train();
  train.global_batch_size = 4;
  train.seq_length = 1024;
  TrialOptions o = NumericOptions();
  o.fingerprint = false;
  const ParallelConfig c = Complete(ParseSpec(spec), World().size());
  const TrialMeasurement got = RunTrial(TestPlatform(), World(), model, train, c, o);
  EXPECT_EQ(got.outcome, Outcome::kOk) << got.message;
  const double measured =
      got.peak_memory_gib.empty()
          ? 0.0
          : *std::max_element(got.peak_memory_gib.begin(), got.peak_memory_gib.end());
  return {measured, PredictedPeakGib(model, c, train)};
}

// What selective recompute's modules save (Megatron's --recompute-modules): at a long sequence
// the trial's peak falls by what the model says it keeps less, for the norms and a MoE layer
// whole, and for the routed experts' activation and the shared experts. A trial that ignored the
// modules would save nothing.
TEST(TrialMemory, RecomputedModulesSaveWhatTheModelSays) {
  const std::string base = "tp=2,dp=2,ep=2,sp=on,recompute=selective";
  const auto [kept_measured, kept_predicted] = MoePeaks(base);
  for (const char* modules : {"layernorm+moe", "moe_act+shared_experts"}) {
    const auto [measured, predicted] = MoePeaks(base + ",recompute_modules=" + modules);
    const double saved = kept_measured - measured, saved_predicted = kept_predicted - predicted;
    EXPECT_GT(saved_predicted, 0.02 * kept_predicted) << modules;
    EXPECT_NEAR(saved / saved_predicted, 1.0, 0.25)
        << modules << ": saved " << saved * 1024 << " MiB, predicted " << saved_predicted * 1024;
    if (World().rank() == 0) {
      std::printf("recompute_modules=%-22s saved %7.3f MiB  predicted %7.3f MiB\n", modules,
                  saved * 1024, saved_predicted * 1024);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TrialFlexDispatcher, Memory,
                         ::testing::Values(Case{"tiny-moe", "tp=2,dp=2,ep=2,sp=on,dispatcher=flex"},
                                           Case{"tiny-moe", "dp=4,ep=2,etp=2,dispatcher=flex"}),
                         CaseName);

// The flex dispatcher keeps no copy of each token's k expert outputs at home (the gates are
// applied beside the experts): at a long sequence the trial's peak falls by what the model says.
// A trial that dispatched by all-to-all under the flex name would save nothing.
TEST(TrialMemory, FlexDispatcherKeepsWhatTheModelSays) {
  const std::string base = "dp=4,ep=2";
  const auto [all_measured, all_predicted] = MoePeaks(base);
  const auto [flex_measured, flex_predicted] = MoePeaks(base + ",dispatcher=flex");
  const double saved = all_measured - flex_measured,
               saved_predicted = all_predicted - flex_predicted;
  EXPECT_GT(saved_predicted, 0.01 * all_predicted);
  EXPECT_NEAR(saved / saved_predicted, 1.0, 0.25)
      << "saved " << saved * 1024 << " MiB, predicted " << saved_predicted * 1024;
  if (World().rank() == 0) {
    std::printf("dispatcher=flex saved %7.3f MiB  predicted %7.3f MiB\n", saved * 1024,
                saved_predicted * 1024);
  }
}

}  // namespace
}  // namespace autopar::trial

namespace autopar::trial {
namespace {

// The MoE layer's own gradients against central differences (equivalence across layouts cannot
// see a wrong gradient that every layout shares): J = Σ c·out + the load-balancing loss, on one
// rank, with the routing unchanged by the perturbations. With c = 0 only the load-balancing loss
// drives the router. Both dispatchers: flex applies the gates beside the experts (before fc2)
// and finds their gradient there.
class MoeGradient : public ::testing::TestWithParam<std::tuple<float, bool>> {};

TEST_P(MoeGradient, MatchesCentralDifferences) {
  Device& dev = TestPlatform().device();
  const Shapes s = testing::OneRankMoe(8, 8, 4, 2, 6, std::get<1>(GetParam()));
  const float scale = std::get<0>(GetParam());
  ProcessGroups g;  // one rank: every group is unconnected
  const int64_t T = s.tokens, h = s.hidden, E = s.experts, f = s.expert_ffn;
  auto moe = MoeLayer::Create(dev, s, g, /*samples_per_step=*/2.0);
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  // Parameters, their gradients, the input, its gradient and the projection c, in one buffer.
  const int64_t router = E * h, fc1 = 2 * f * h, fc2 = h * f, params = router + E * (fc1 + fc2);
  auto buffer = dev.Allocate(2 * params + 3 * T * h, device::DType::kF32);
  ASSERT_TRUE(buffer.ok());
  const Tensor all = buffer->tensor();
  const Tensor w = all.Slice(0, params), dw = all.Slice(params, params);
  const Tensor x = all.Slice(2 * params, T * h), dx = all.Slice(2 * params + T * h, T * h);
  const Tensor c = all.Slice(2 * params + 2 * T * h, T * h);
  const LayerWeights lw = testing::MoeWeights(s, w, dw);
  std::vector<float> host(static_cast<size_t>(all.numel), 0.0f);
  for (int64_t i = 0; i < params; ++i) host[i] = 0.5f * kernels::ref::HashUniform(31, i);
  for (int64_t i = 0; i < T * h; ++i) {
    host[2 * params + i] = kernels::ref::HashUniform(32, i);
    host[2 * params + 2 * T * h + i] = scale * kernels::ref::HashUniform(33, i);
  }
  ASSERT_TRUE(dev.Upload(all, host).ok());
  auto out_buf = dev.Allocate(T * h, device::DType::kF32);
  ASSERT_TRUE(out_buf.ok());
  const Tensor out = out_buf->tensor();

  // J at the current values; `choice` is the routing it used.
  auto objective = [&](std::vector<int32_t>* choice) {
    MoeActs acts;
    EXPECT_TRUE(dev.Fill(out, 0.0f).ok());
    EXPECT_TRUE((*moe)->Forward(lw, acts, x, out, true).ok());
    if (choice) *choice = acts.choice;
    const std::vector<float> o = dev.Download<float>(out).value();
    const std::vector<float> cc = dev.Download<float>(c).value();
    double j = (*moe)->TakeAuxLoss();
    for (size_t i = 0; i < o.size(); ++i) j += double{o[i]} * cc[i];
    return j;
  };
  // Analytic gradients.
  std::vector<int32_t> routing;
  {
    MoeActs acts;
    ASSERT_TRUE(dev.Fill(out, 0.0f).ok());
    ASSERT_TRUE((*moe)->Forward(lw, acts, x, out, true).ok());
    (*moe)->TakeAuxLoss();
    routing = acts.choice;
    ASSERT_TRUE((*moe)->BackwardExperts(lw, acts, c).ok());
    ASSERT_TRUE((*moe)->BackwardRouter(lw, acts, x, dx).ok());
  }
  const std::vector<float> analytic = dev.Download<float>(all).value();
  // Central differences at a spread of coordinates of every parameter and of the input.
  // fp32 forward passes: the difference quotient carries ~1e-5 of rounding noise.
  const float eps = 4e-3f;
  const double tolerance = scale > 0 ? 2e-5 : 2e-7;
  int checked = 0;
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < params + T * h; i += 7) {
    const int64_t at = i < params ? i : 2 * params + (i - params);
    const int64_t grad_at = i < params ? params + i : 2 * params + T * h + (i - params);
    std::vector<float> moved = host;
    std::vector<int32_t> up_routing, down_routing;
    moved[at] = host[at] + eps;
    ASSERT_TRUE(dev.Upload(all, moved).ok());
    const double up = objective(&up_routing);
    moved[at] = host[at] - eps;
    ASSERT_TRUE(dev.Upload(all, moved).ok());
    const double down = objective(&down_routing);
    if (up_routing != routing || down_routing != routing) continue;  // a top-k boundary
    const double numeric = (up - down) / (2.0 * eps);
    const double err = std::abs(numeric - analytic[grad_at]);
    worst = std::max(worst, err);
    largest = std::max(largest, std::abs(numeric));
    EXPECT_NEAR(analytic[grad_at], numeric, 1e-2 * std::abs(numeric) + tolerance)
        << "coordinate " << i << (i < params ? " (parameter)" : " (input)");
    ++checked;
  }
  ASSERT_TRUE(dev.Upload(all, host).ok());
  EXPECT_GT(checked, (params + T * h) / 7 / 2) << "too many routing changes";
  // The check is only as good as the gradients are large against the tolerance.
  EXPECT_GT(largest, 30 * tolerance);
  if (World().rank() == 0) {
    std::printf("moe gradient c=%g%s: %d checked, largest %.2e, worst error %.2e\n", scale,
                s.flex ? " flex" : "", checked, largest, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Trial, MoeGradient,
                         ::testing::Combine(::testing::Values(1.0f, 0.0f), ::testing::Bool()));

// Megatron's --moe-router-force-load-balancing (RandomLogits, what trials run by default): a
// router that sends every token to expert 0 routes them there by its own logits, and evenly once
// forced, the same tokens to the same experts whatever its weights (training cannot move it).
TEST(MoeForcedBalance, RoutesEvenlyWhateverTheRouterWeights) {
  Device& dev = TestPlatform().device();
  const Shapes s = testing::OneRankMoe(512, 8, 8, 2, 4, /*flex=*/false);
  ProcessGroups g;  // one rank: every group is unconnected
  const int64_t T = s.tokens, h = s.hidden, E = s.experts, k = s.topk, f = s.expert_ffn;
  auto moe = MoeLayer::Create(dev, s, g, /*samples_per_step=*/2.0);
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  const int64_t router = E * h, params = router + E * (2 * f * h + h * f);
  auto buffer = dev.Allocate(2 * params + 2 * T * h, device::DType::kF32);
  ASSERT_TRUE(buffer.ok());
  const Tensor all = buffer->tensor();
  const LayerWeights lw = testing::MoeWeights(s, all.Slice(0, params), all.Slice(params, params));
  const Tensor x = all.Slice(2 * params, T * h), out = all.Slice(2 * params + T * h, T * h);
  // Inputs of positive entries and a router whose row 0 is large: expert 0 wins every token.
  std::vector<float> host(static_cast<size_t>(all.numel), 0.0f);
  for (int64_t i = 0; i < params; ++i) host[i] = 0.1f * kernels::ref::HashUniform(41, i);
  for (int64_t i = 0; i < h; ++i) host[i] = 1.0f;
  for (int64_t i = 0; i < T * h; ++i)
    host[2 * params + i] = 1.5f + kernels::ref::HashUniform(42, i);
  const RandomLogits draws{kernels::ref::SplitMix64(7), /*first_sample=*/0};
  auto route = [&](const std::optional<RandomLogits>& random) {
    MoeActs acts;
    EXPECT_TRUE(dev.Upload(all, host).ok());
    EXPECT_TRUE((*moe)->Forward(lw, acts, x, out, true, random).ok());
    (*moe)->TakeAuxLoss();
    return acts;
  };
  const MoeActs learned = route(std::nullopt);
  EXPECT_EQ(learned.expert_rows[0], T) << "the router's own logits: every token to expert 0";
  const MoeActs forced = route(draws);
  const double share = static_cast<double>(T * k) / E;  // 256 rows each
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_NEAR(forced.expert_rows[e], share, 0.25 * share) << "expert " << e;
  }
  // Other router weights (expert 7 now wins), the same forced routing.
  for (int64_t i = 0; i < h; ++i) std::swap(host[i], host[(E - 1) * h + i]);
  EXPECT_EQ(route(std::nullopt).expert_rows[E - 1], T);
  const MoeActs moved = route(draws);
  EXPECT_EQ(moved.choice, forced.choice);
  EXPECT_EQ(moved.gate, forced.gate);
  // Another layer's stream routes otherwise.
  EXPECT_NE(route(RandomLogits{kernels::ref::SplitMix64(8), 0}).choice, forced.choice);
}

// Hidden dropout (Megatron's --hidden-dropout, TrialOptions::hidden_dropout): a recomputed forward
// draws the masks the first forward drew, so full and selective recompute update the weights as
// keeping everything does; the masks change the step (a dropout that did nothing would match the
// run without it); and they cost the memory the model says (1 byte per element of each block's
// output, the SP shard's rows, per layer in flight).
TEST(TrialDropout, RecomputeDrawsTheSameMasks) {
  const ModelSpec model = ModelPreset("tiny");
  TrialOptions o = NumericOptions();
  o.hidden_dropout = kMegatronHiddenDropout;
  auto run = [&](const std::string& spec, const TrialOptions& options) {
    const ParallelConfig c = Complete(ParseSpec(spec), World().size());
    return RunTrial(TestPlatform(), World(), model, Train(), c, options);
  };
  const TrialMeasurement kept = run("tp=2,pp=2,sp=on", o);
  ASSERT_EQ(kept.outcome, Outcome::kOk) << kept.message;
  for (const char* spec : {"tp=2,pp=2,sp=on,recompute=full",
                           "tp=2,pp=2,sp=on,recompute=selective,recompute_modules=layernorm+mlp"}) {
    const TrialMeasurement got = run(spec, o);
    ASSERT_EQ(got.outcome, Outcome::kOk) << got.message;
    ExpectClose(got.loss, kept.loss, std::string(spec) + ": loss");
    ExpectClose(got.weight_sum, kept.weight_sum, std::string(spec) + ": weight sum");
    ExpectClose(got.weight_projection, kept.weight_projection,
                std::string(spec) + ": weight projection");
  }
  const TrialMeasurement none = run("tp=2,pp=2,sp=on", NumericOptions());
  ASSERT_EQ(none.outcome, Outcome::kOk) << none.message;
  // Five times ExpectClose's tolerance (the tiny model's small block outputs move the loss
  // little; the update, 2e-4 here, more).
  EXPECT_GT(std::abs(none.weight_projection - kept.weight_projection),
            1e-4 * std::max(1.0, std::abs(none.weight_projection)));
}

TEST(TrialDropout, MasksCostWhatTheModelSays) {
  const ModelSpec model = ModelPreset("tiny");
  TrainSpec train = Train();
  train.global_batch_size = 4;
  train.seq_length = 1024;
  const ParallelConfig c = Complete(ParseSpec("tp=2,dp=2,sp=on"), World().size());
  auto peak = [&](float dropout) {
    TrialOptions o = NumericOptions();
    o.fingerprint = false;
    o.hidden_dropout = dropout;
    const TrialMeasurement got = RunTrial(TestPlatform(), World(), model, train, c, o);
    EXPECT_EQ(got.outcome, Outcome::kOk) << got.message;
    return got.peak_memory_gib.empty()
               ? 0.0
               : *std::max_element(got.peak_memory_gib.begin(), got.peak_memory_gib.end());
  };
  const double added = peak(kMegatronHiddenDropout) - peak(0);
  const double predicted =
      PredictedPeakGib(model, c, train, true) - PredictedPeakGib(model, c, train, false);
  EXPECT_GT(predicted, 0);
  EXPECT_NEAR(added / predicted, 1.0, 0.25)
      << "added " << added * 1024 << " MiB, predicted " << predicted * 1024;
  if (World().rank() == 0) {
    std::printf("hidden dropout masks %7.3f MiB  predicted %7.3f MiB\n", added * 1024,
                predicted * 1024);
  }
}

}  // namespace
}  // namespace autopar::trial
