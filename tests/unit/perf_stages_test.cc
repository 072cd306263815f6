// Uneven pipeline stages in the cost model: per-stage time and memory, and the balancer
// (CostModel::BalanceStages) against brute force over every split Megatron accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>

#include "autopar/common/errors.h"
#include "autopar/perf/cost_model.h"
#include "autopar/perf/ranking.h"
#include "autopar/spec/parse.h"

namespace autopar {
namespace {

struct Job {
  ModelSpec model = ModelPreset("llama2-7b");
  TrainSpec train;
  ClusterSpec cluster;
  Job(int64_t layers, int64_t gpus, double memory_gib) {
    model.num_layers = layers;
    train.global_batch_size = 64;
    train.seq_length = 4096;
    cluster.nnodes = 1;
    cluster.gpus_per_node = gpus;
    cluster.gpu = GpuPreset("h100");
    cluster.gpu.memory_gib = memory_gib;
  }
  CostModel Model() const {
    return CostModel(model, train, cluster, DefaultConstants(cluster.gpu.name));
  }
};

struct Slowest {
  double time_s = 0, memory_gib = 0;
};
Slowest SlowestStage(const CostModel& model, const ParallelConfig& c) {
  Slowest out;
  for (const CostModel::StageEstimate& s : model.Stages(c)) {
    out.time_s = std::max(out.time_s, s.time_s);
    out.memory_gib = std::max(out.memory_gib, s.memory_gib);
  }
  return out;
}

// The best split (and depth, where asked) by trying every (pp_first, pp_last, recompute_layers)
// and every count of the embedding and the loss in the split that Megatron accepts: the fastest
// slowest stage among those that fit, else the least memory.
ParallelConfig BruteForce(const CostModel& model, const Job& job, ParallelConfig c, bool depths) {
  const int64_t n = job.model.num_layers;
  std::vector<ParallelConfig> splits;
  for (int32_t first = 0; first <= n; ++first) {
    for (int32_t last = 0; last <= n; ++last) {
      ParallelConfig t = c;
      t.pp_first = first;
      t.pp_last = last;
      splits.push_back(t);
    }
  }
  for (const bool embedding : {false, true}) {
    for (const bool loss : {false, true}) {
      ParallelConfig t = c;
      t.split_embedding = embedding;
      t.split_loss = loss;
      if ((embedding || loss) && c.vpp > 1) splits.push_back(t);
    }
  }
  ParallelConfig best = c, least = c;
  double best_time = std::numeric_limits<double>::infinity(), best_memory = best_time;
  double least_memory = best_time;
  for (const ParallelConfig& split : splits) {
    for (int32_t depth = 0; depth <= (depths ? n : 0); ++depth) {
      ParallelConfig t = split;
      if (depths) t.recompute_layers = depth;
      if (!StageSplitError(t, n).empty()) continue;
      const Slowest s = SlowestStage(model, t);
      if (s.memory_gib <= job.cluster.gpu.memory_gib) {
        if (s.time_s < best_time || (s.time_s == best_time && s.memory_gib < best_memory)) {
          best_time = s.time_s;
          best_memory = s.memory_gib;
          best = t;
        }
      } else if (s.memory_gib < least_memory) {
        least_memory = s.memory_gib;
        least = t;
      }
    }
  }
  return best_time < std::numeric_limits<double>::infinity() ? best : least;
}

void ExpectSameOptimum(const Job& job, const std::string& spec, bool depths) {
  const CostModel model = job.Model();
  const ParallelConfig c = Complete(ParseSpec(spec), job.cluster.world_size());
  ParallelConfig balanced = c;
  ASSERT_TRUE(model.BalanceStages(balanced, depths)) << spec;
  EXPECT_EQ(StageSplitError(balanced, job.model.num_layers), "") << ToSpec(balanced);
  const ParallelConfig brute = BruteForce(model, job, c, depths);
  const Slowest got = SlowestStage(model, balanced), want = SlowestStage(model, brute);
  EXPECT_DOUBLE_EQ(got.time_s, want.time_s) << ToSpec(balanced) << " vs " << ToSpec(brute);
  EXPECT_EQ(got.memory_gib <= job.cluster.gpu.memory_gib,
            want.memory_gib <= job.cluster.gpu.memory_gib);
}

TEST(Stages, BalancerFindsTheBruteForceOptimumWithAndWithoutAMemoryLimit) {
  // 30 layers on 4 stages (no even split), 1F1B and interleaved, with room to spare, and with
  // a limit that binds on the first stage (it holds pp micro-batches in flight).
  for (double memory : {200.0, 45.0, 30.0}) {
    const Job job(30, 8, memory);
    ExpectSameOptimum(job, "tp=2,pp=4,mbs=1", false);
    ExpectSameOptimum(job, "tp=2,pp=4,mbs=2,vpp=2", false);
    ExpectSameOptimum(job, "tp=2,pp=4,mbs=1,recompute=full", true);
    ExpectSameOptimum(job, "tp=4,pp=2,mbs=1,recompute=full", true);
    // 30 layers and the embedding and the loss over 4 × 2 chunks of 4, against pp_first=6.
    ExpectSameOptimum(job, "tp=2,pp=4,mbs=2,vpp=2,recompute=full", true);
  }
}

TEST(Stages, TheEmbeddingAndTheLossCountedOpenVirtualStagesThatDoNotDivideTheLayers) {
  // 126 layers (Llama 3 405B's) over pp 16: vpp 4 and 8 split only with the embedding and the
  // loss counted (128 = 16 × 8 chunks of 1); vpp 5 splits neither way.
  const Job job(126, 16, 200.0);
  const CostModel model = job.Model();
  for (const int vpp : {4, 8}) {
    ParallelConfig c = Complete(ParseSpec("tp=1,pp=16,mbs=1,vpp=" + std::to_string(vpp)),
                                job.cluster.world_size());
    ASSERT_TRUE(model.BalanceStages(c, false)) << vpp;
    EXPECT_TRUE(c.split_embedding && c.split_loss) << ToSpec(c);
    EXPECT_EQ(StageSplitError(c, 126), "") << ToSpec(c);
  }
  ParallelConfig five = Complete(ParseSpec("tp=1,pp=16,mbs=1,vpp=5"), job.cluster.world_size());
  const ParallelConfig before = five;
  EXPECT_FALSE(model.BalanceStages(five, false));
  EXPECT_EQ(five, before);
}

TEST(Stages, TheLastStageGivesUpLayersToItsLogits) {
  // 32 layers split evenly over 4 stages leave the last stage slowest: with Llama 3's vocabulary
  // its logits and loss take about as long as two or three layers. The balancer moves layers
  // off it and the slowest stage gets faster.
  Job job(32, 8, 200);
  job.model.vocab_size = 128256;
  const CostModel model = job.Model();
  const ParallelConfig even = Complete(ParseSpec("tp=2,pp=4"), 8);
  ParallelConfig balanced = even;
  ASSERT_TRUE(model.BalanceStages(balanced, false));
  EXPECT_TRUE(UnevenStages(balanced)) << ToSpec(balanced);
  EXPECT_LT(StageLayers(balanced, 32, 3), 8);
  EXPECT_LT(SlowestStage(model, balanced).time_s, SlowestStage(model, even).time_s);
  EXPECT_LT(model.Time(balanced).step_time_s, model.Time(even).step_time_s);
}

TEST(Stages, EachStageIsCostedFromItsOwnLayers) {
  const Job job(30, 8, 200);
  const CostModel model = job.Model();
  const ParallelConfig c = Complete(ParseSpec("tp=2,pp=4,pp_first=6,pp_last=6"), 8);
  const std::vector<CostModel::StageEstimate> stages = model.Stages(c);
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_EQ(stages[0].layers, 6);
  EXPECT_EQ(stages[1].layers, 9);
  EXPECT_EQ(stages[3].layers, 6);
  // A middle stage of 9 layers takes 1.5 times the first stage's 6 (the same layers, no
  // embedding time) and paces the pipeline.
  EXPECT_NEAR(stages[1].time_s / stages[0].time_s, 1.5, 1e-9);
  EXPECT_NEAR(model.Time(c).forward_per_microbatch_s + model.Time(c).backward_per_microbatch_s,
              stages[1].time_s, 1e-12);
  // The first stage keeps 4 micro-batches in flight, the second 3: with 6 against 9 layers
  // the second needs more memory, and the peak is the most loaded stage's.
  EXPECT_GT(stages[1].memory_gib, stages[0].memory_gib);
  double peak = 0;
  for (const auto& s : stages) peak = std::max(peak, s.memory_gib);
  EXPECT_NEAR(model.Evaluate(c).peak_memory_gib, peak, 1e-9);
}

TEST(Stages, TheSpaceWithABalancerOffersPipelinesThatDoNotDivideTheLayers) {
  const Job job(30, 8, 200);
  const CostModel model = job.Model();
  const StageBalancer balancer(model);
  const SearchSpace even(job.model, job.train, job.cluster, SpaceOptions{});
  const SearchSpace uneven(job.model, job.train, job.cluster, SpaceOptions{}, &balancer);
  bool even_has_pp4 = false, uneven_has_pp4 = false;
  even.ForEach([&](const ParallelConfig& c) { even_has_pp4 |= c.pp == 4; });
  uneven.ForEach([&](const ParallelConfig& c) {
    uneven_has_pp4 |= c.pp == 4;
    EXPECT_EQ(uneven.Check(c), "") << ToSpec(c);
  });
  EXPECT_FALSE(even_has_pp4);
  EXPECT_TRUE(uneven_has_pp4);
}

TEST(Stages, TheSpaceOffersTheVirtualStagesOnlyACountedSplitOpens) {
  // 126 layers (Llama 3 405B's) on 16 GPUs: pp 16 takes vpp 4 and 8 only with the embedding and
  // the loss counted; each such configuration is valid, and a --vpp that divides neither the
  // layers nor them plus one or two is refused by name.
  const Job job(126, 16, 200);
  const CostModel model = job.Model();
  const StageBalancer balancer(model);
  SpaceOptions options;
  options.pp = {16};
  options.mbs = {1};
  const SearchSpace space(job.model, job.train, job.cluster, options, &balancer);
  std::set<int32_t> counted_vpp;
  space.ForEach([&](const ParallelConfig& c) {
    EXPECT_EQ(space.Check(c), "") << ToSpec(c);
    if (c.split_embedding || c.split_loss) counted_vpp.insert(c.vpp);
  });
  EXPECT_TRUE(counted_vpp.count(4) == 1 && counted_vpp.count(8) == 1) << counted_vpp.size();
  options.vpp = {5};
  try {
    const SearchSpace refused(job.model, job.train, job.cluster, options, &balancer);
    ADD_FAILURE() << "vpp=5 accepted for 126 layers";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--vpp");
    EXPECT_NE(std::string(e.what()).find("num_layers + 1 or + 2"), std::string::npos) << e.what();
  }
}

TEST(Stages, DeepSeekV3OnH800RanksADeepPipelineFirst) {
  // Issue 12's acceptance: 61 layers allow only pp = 1 with even stages.
  const ModelSpec model = ModelPreset("deepseek-v3");
  TrainSpec train;
  train.global_batch_size = 4096;
  train.seq_length = 4096;
  ClusterSpec cluster;
  cluster.nnodes = 128;
  cluster.gpus_per_node = 8;
  cluster.gpu = GpuPreset("h800");
  const CostModel cost(model, train, cluster, DefaultConstants(cluster.gpu.name));
  const StageBalancer balancer(cost);
  SpaceOptions options;
  options.pp = {1, 8, 16};  // keeps the test short; pp = 1 is the even split's only choice
  options.mbs = {1};
  const Ranking r = RankSpace(SearchSpace(model, train, cluster, options, &balancer), cost, 20);
  ASSERT_FALSE(r.top.empty());
  EXPECT_GE(r.top.front().config.pp, 8) << ToSpec(r.top.front().config);
  EXPECT_TRUE(UnevenStages(r.top.front().config));
  bool etp_differs = false;
  for (const RankedConfig& x : r.top) etp_differs |= x.config.expert_tp() != x.config.tp;
  EXPECT_TRUE(etp_differs);
}

}  // namespace
}  // namespace autopar
