// The cost model's context-parallel, Ulysses and expert-parallel terms: what each layout holds in
// memory and sends, as the trial runner does it.
#include <gtest/gtest.h>

#include <ios>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "space_test_util.h"

namespace autopar {
namespace {

using testing::SmallCluster;
using testing::SmallTrain;

ParallelConfig Spec(const std::string& text, int64_t world) {
  return Complete(ParseSpec(text), world);
}

// Long sequences: CP and Ulysses split the same attention work; what differs is communication.
struct LongSequence : ::testing::Test {
  ModelSpec model = ModelPreset("llama3-8b");  // 32 heads, 8 kv heads
  ClusterSpec cluster = [] {
    ClusterSpec c = SmallCluster(8, 8);
    c.gpu.name = "h100";  // the flash kernels' shape law (AttentionShapeLawOf)
    return c;
  }();
  CostModel cm{model, SmallTrain(64, 131072), cluster, PerfConstants{}};
  TimeBreakdown T(const std::string& spec) { return cm.Time(Spec(spec, 64)); }
  MemoryBreakdown M(const std::string& spec) { return cm.Memory(Spec(spec, 64)); }
};

// The same attention FLOPs; the ring's kernels are shorter: each step pairs s/cp rows with a
// load-balanced half-chunk of s/(2·cp) keys, where Ulysses attends over all s.
TEST_F(LongSequence, CpAndUlyssesSplitTheAttentionAlike) {
  const AttentionShapeLaw law = AttentionShapeLawOf(cluster.gpu.name);
  const double s = 131072, d = model.head_dim();
  const double up = T("tp=2,up=8,dp=4").features[kAttention];
  auto slower = [&](double keys) {
    return AttentionShapeFactor(law, s, d) / AttentionShapeFactor(law, keys, d);
  };
  EXPECT_NEAR(T("tp=2,cp=8,dp=4").features[kAttention], up * slower(s / 16), 1e-9 * up);
  EXPECT_NEAR(T("tp=2,cp=4,up=2,dp=4").features[kAttention], up * slower(s / 8), 1e-9 * up);
  EXPECT_GT(slower(s / 16), slower(s / 8));
  EXPECT_GT(slower(s / 8), 1);
}

TEST_F(LongSequence, EachSplitPaysItsOwnCommunication) {
  const TimeBreakdown cp = T("tp=2,cp=8,dp=4"), up = T("tp=2,up=8,dp=4");
  EXPECT_EQ(cp.features[kUlyssesComm], 0);
  EXPECT_EQ(up.features[kCpComm], 0);
  EXPECT_GT(up.features[kUlyssesComm], 0);
  // The ring hides its K/V transfers behind 128k-token attention; the dK/dV blocks' last hop
  // home is all that shows.
  EXPECT_GT(cp.features[kCpComm], 0);
  EXPECT_LT(cp.features[kCpComm], 0.05 * cp.features[kAttention]);
}

// All-gathered K and V (Transformer Engine's AttnFuncWithCPAndKVAllGather): two all-gathers
// before the attention in the forward, nothing overlapping them; the backward gathers again and
// reduce-scatters dK and dV. Each query chunk's kernel runs over its key prefix, (2·cp + 1)/(4·cp)
// of the sequence on average, longer than the ring's half-chunks.
TEST_F(LongSequence, AllGatherExposesItsCollectivesAndRunsLongerKernels) {
  const ParallelConfig c = Spec("tp=2,cp=8,dp=4,cp_comm=allgather", 64);
  const double tokens = 131072.0 / 8, d = 128, kv = 8.0 / 2, cp = 8;
  const double half = 2 * tokens * kv * d;  // K (or V) of a rank's rows, bf16
  const double per_layer = 2 * cm.AllGatherTime(cp * half, 8, 2);
  const double microbatches = 64.0 / 4;
  const TimeBreakdown gathered = cm.Time(c), ring = T("tp=2,cp=8,dp=4");
  EXPECT_NEAR(gathered.features[kCpComm], microbatches * model.num_layers * 3 * per_layer,
              1e-9 * per_layer);
  EXPECT_GT(gathered.features[kCpComm], 3 * ring.features[kCpComm]);  // the ring hides its steps
  const AttentionShapeLaw law = AttentionShapeLawOf(cluster.gpu.name);
  const double s = 131072;
  EXPECT_NEAR(ring.features[kAttention] / gathered.features[kAttention],
              AttentionShapeFactor(law, s * (2 * cp + 1) / (4 * cp), d) /
                  AttentionShapeFactor(law, s / (2 * cp), d),
              1e-9);
  // Every rank's K/V three ways (gathered, in sequence order, their gradients) where the ring
  // holds six blocks of its own rows.
  const double kv_block = 2 * tokens * 2 * kv * d;
  EXPECT_NEAR(cm.Memory(c).activations - M("tp=2,cp=8,dp=4").activations,
              (2 + 3 * cp - 6) * kv_block, 1e-6 * kv_block);
}

TEST_F(LongSequence, UlyssesSendsQkvAndTheOutputBothWays) {
  // tp = 2 leaves 16 query and 4 kv heads per tp rank; up = 4 scatters both (Transformer Engine
  // needs up to divide them), so each up rank receives 4 query heads and 1 kv head of every row.
  const ParallelConfig c = Spec("tp=2,up=4,dp=8", 64);
  const double tokens = 131072.0 / 4, d = 128, heads = 32.0 / 2, kv = 8.0 / 2;
  const double qkv = 2 * tokens * d * (heads + 2 * kv), o = 2 * tokens * d * heads;
  const double per_layer = cm.AllToAllTime(qkv, 4, 2) + cm.AllToAllTime(o, 4, 2);
  const double microbatches = 64.0 / 8;
  EXPECT_NEAR(cm.Time(c).features[kUlyssesComm], microbatches * model.num_layers * 2 * per_layer,
              1e-9 * per_layer);
}

TEST_F(LongSequence, ShortSequencesExposeTheRing) {
  const CostModel short_cm(model, SmallTrain(64, 8192), cluster, PerfConstants{});
  const TimeBreakdown t = short_cm.Time(Spec("tp=8,cp=8,dp=1", 64));
  // 8k tokens over a ring of 8 nodes: each step's attention is too short to hide a K/V block.
  EXPECT_GT(t.features[kCpComm], 0.1 * t.features[kAttention]);
}

TEST_F(LongSequence, UlyssesKeepsTheHeadShardedOutputToo) {
  // Same tokens per rank and kv heads per up rank: Ulysses keeps one more [tokens, heads/tp·d]
  // tensor per layer (the attention output before the all-to-all back), unless selective
  // recompute reruns the attention.
  const double per_token = 2.0 * model.hidden_size / 2;  // bf16 · heads/tp · d with tp = 2
  const double tokens = 131072.0 / 8;
  const double layers = model.num_layers;
  const double cp = M("tp=2,cp=8,dp=4").activations, up = M("tp=2,cp=2,up=4,dp=4").activations;
  EXPECT_GT(up, cp + 0.99 * layers * per_token * tokens);
  const double cp_sel = M("tp=2,cp=8,dp=4,recompute=selective").activations;
  const double up_sel = M("tp=2,cp=2,up=4,dp=4,recompute=selective").activations;
  EXPECT_LT(up_sel - cp_sel, up - cp);
}

TEST(Memory, DistributedOptimizerShardsOverEveryReplica) {
  // Dense parameters are replicated over up·cp·dp ranks; experts over up·cp·dp / ep.
  const ModelSpec m = ModelPreset("mixtral-8x7b");
  const CostModel cm(m, SmallTrain(64, 32768), SmallCluster(4, 8), PerfConstants{});
  const ParamCounts p = CountParams(m);
  const double dense = (p.embedding + p.output_layer + p.final_norm +
                        m.num_layers * static_cast<double>(p.moe_layer_non_expert())) /
                       2;
  const double experts = m.num_layers * static_cast<double>(p.expert_per_layer) / (2 * 4);
  const MemoryBreakdown mem = cm.Memory(Spec("tp=2,cp=2,up=2,dp=4,ep=4,dist_opt=on", 32));
  EXPECT_NEAR(mem.optimizer, 12 * (dense / 16 + experts / 4), 1e-6 * mem.optimizer);
  EXPECT_NEAR(mem.weights, 2 * (dense + experts), 1e-6 * mem.weights);
}

TEST(Time, ExpertParallelDispatchAndCombine) {
  const ModelSpec m = ModelPreset("mixtral-8x7b");
  const CostModel cm(m, SmallTrain(256, 4096), SmallCluster(4, 8), PerfConstants{});
  auto ep_comm = [&](const CostModel& model, const std::string& spec) {
    return model.Time(Spec(spec, 32)).features[kEpComm];
  };
  EXPECT_EQ(ep_comm(cm, "tp=1,dp=32,ep=1"), 0);  // experts local, nothing to send
  const double ep8 = ep_comm(cm, "tp=1,dp=32,ep=8");
  EXPECT_GT(ep8, 0);
  // The same all-to-alls across nodes (two GPUs per node) are slower than inside one.
  const CostModel spread(m, SmallTrain(256, 4096), SmallCluster(16, 2), PerfConstants{});
  EXPECT_GT(ep_comm(spread, "tp=1,dp=32,ep=8"), 2 * ep8);
  // With tp the experts are tp-sharded: what arrives is all-gathered (and the results
  // reduce-scattered) over tp, even without expert parallelism.
  EXPECT_GT(ep_comm(cm, "tp=2,dp=16,ep=1,sp=on"), 0);
  // Experts are split over ep: fewer expert parameters per rank.
  const MemoryBreakdown ep1 = cm.Memory(Spec("tp=1,dp=32,ep=1", 32));
  const MemoryBreakdown ep8m = cm.Memory(Spec("tp=1,dp=32,ep=8", 32));
  EXPECT_LT(ep8m.weights, 0.3 * ep1.weights);
}

// Expert tensor parallel (etp, MoE parallel folding). At etp = tp the model is what it was before
// etp existed: these are that model's numbers, bit for bit (step time, peak memory), the step
// times re-pinned with issue 14's attention (the kernels' shape law on Hopper), its
// cross-entropy passes (Megatron's FP32 vocab-parallel loss), the asynchronous
// tensor-parallel backward and the routed experts' grouped GEMM (its row tiles and weight read,
// ExpertGemmTime).
TEST(ExpertTensorParallelAtTp, EstimatesAreThoseOfTheModelBeforeEtp) {
  struct Golden {
    const char* model;
    const char* gpu;
    int64_t nnodes, gbs, seq;
    const char* spec;
    double step_time_s, memory_bytes;
  };
  const Golden golden[] = {
      {"mixtral-8x7b", "h100", 4, 256, 4096,
       "tp=2,pp=2,dp=8,ep=8,vpp=2,mbs=1,sp=on,recompute=selective,dist_opt=on",
       0x1.901a64d527951p+2, 0x1.a0814cp+35},
      {"mixtral-8x7b", "h100", 4, 256, 4096, "tp=4,dp=8,ep=4,mbs=2,sp=on,recompute=full",
       0x1.356036b80b3e6p+3, 0x1.e659d97333333p+35},
      {"mixtral-8x7b", "h100", 4, 64, 32768,
       "tp=2,dp=4,cp=2,up=2,ep=4,sp=on,recompute=full,dist_opt=on", 0x1.559aa6a8d548dp+4,
       0x1.eac88fe333333p+35},
      {"deepseek-v3", "h800", 32, 1024, 4096, "tp=2,dp=128,ep=64,sp=on,recompute=full,dist_opt=on",
       0x1.02e0ab2a01bccp+5, 0x1.df2e77ded999ap+36},
      {"deepseek-v3", "h800", 32, 1024, 4096,
       "tp=8,dp=32,ep=32,sp=on,recompute=selective,dist_opt=on", 0x1.851984189e08fp+5,
       0x1.9c4946afa6666p+36},
      {"deepseek-v3", "h800", 8, 64, 32768,
       "tp=4,dp=4,cp=2,up=2,ep=8,sp=on,recompute=full,dist_opt=on", 0x1.dfa46adff1ffbp+6,
       0x1.193fff05a6666p+38},
  };
  for (const Golden& g : golden) {
    ClusterSpec cluster;
    cluster.nnodes = g.nnodes;
    cluster.gpus_per_node = 8;
    cluster.gpu = GpuPreset(g.gpu);
    const CostModel cm(ModelPreset(g.model), SmallTrain(g.gbs, g.seq), cluster,
                       DefaultConstants(g.gpu));
    for (const std::string etp : {"", ",etp="}) {
      ParallelConfig c = Spec(g.spec, g.nnodes * 8);
      if (!etp.empty()) c = Spec(std::string(g.spec) + etp + std::to_string(c.tp), g.nnodes * 8);
      const Estimate e = cm.Evaluate(c);
      // The message gives the value as a hex float, as the table holds it.
      EXPECT_EQ(e.time.step_time_s, g.step_time_s)
          << g.model << " " << g.spec << etp << ": " << std::hexfloat << e.time.step_time_s;
      EXPECT_EQ(e.memory.total(), g.memory_bytes)
          << g.model << " " << g.spec << etp << ": " << std::hexfloat << e.memory.total();
    }
  }
}

struct ExpertTensorParallel : ::testing::Test {
  ModelSpec model = ModelPreset("mixtral-8x7b");
  CostModel cm{model, SmallTrain(256, 4096), SmallCluster(4, 8), PerfConstants{}};
  ParamCounts p = CountParams(model);
  TimeBreakdown T(const std::string& spec) { return cm.Time(Spec(spec, 32)); }
  MemoryBreakdown M(const std::string& spec) { return cm.Memory(Spec(spec, 32)); }
};

TEST_F(ExpertTensorParallel, ExpertsSplitByEtpNotTp) {
  // Weights per rank: dense ones by tp, the experts by etp·ep.
  const double experts = model.num_layers * static_cast<double>(p.expert_per_layer);
  const MemoryBreakdown at_tp = M("tp=4,dp=8,ep=2,sp=on"), one = M("tp=4,dp=8,ep=2,sp=on,etp=1");
  EXPECT_NEAR(one.weights - at_tp.weights, 2 * experts / 2 * (1 - 1.0 / 4), 1e-6 * one.weights);
  // etp·ep fixed: the same expert shard, whichever way it is cut.
  EXPECT_NEAR(M("tp=4,dp=8,ep=8,sp=on,etp=1").weights, M("tp=4,dp=8,ep=2,sp=on").weights,
              1e-9 * one.weights);
  // The distributed optimizer shards the experts over tp·dp / (etp·ep) = 32 / (1·2) ranks.
  const MemoryBreakdown dist = M("tp=4,dp=8,ep=2,sp=on,etp=1,dist_opt=on");
  const double dense = (p.embedding + p.output_layer + p.final_norm +
                        model.num_layers * static_cast<double>(p.moe_layer_non_expert())) /
                       4;
  EXPECT_NEAR(dist.optimizer, 12 * (dense / 8 + experts / 2 / 16), 1e-6 * dist.optimizer);
}

TEST_F(ExpertTensorParallel, EtpOneNeedsNoAllGatherAndRunsWiderExpertGemms) {
  // Without expert parallelism the only expert communication is the etp all-gather and
  // reduce-scatter: none at etp = 1.
  EXPECT_GT(T("tp=4,dp=8,sp=on").features[kEpComm], 0);
  EXPECT_EQ(T("tp=4,dp=8,sp=on,etp=1").features[kEpComm], 0);
  // Same FLOPs, full-width expert GEMMs instead of quarter-width ones.
  EXPECT_LT(T("tp=4,dp=8,ep=2,sp=on,etp=1").features[kGemm],
            T("tp=4,dp=8,ep=2,sp=on").features[kGemm]);
  // Experts over etp·ep = 8 ranks of a node: the all-to-all stays on NVLink (stride 1), where at
  // etp = tp an ep of 8 runs at stride tp across nodes.
  const double inside = T("tp=4,dp=8,ep=8,sp=on,etp=1").features[kEpComm];
  const double across = T("tp=4,dp=8,ep=8,sp=on").features[kEpComm];
  EXPECT_LT(inside, across);
}

TEST_F(ExpertTensorParallel, ExpertGradientsReduceOverTheExpertDataParallelGroup) {
  // tp=4, dp=8, ep=2: 16 expert replicas at etp = 1 (each rank holds 4 times the expert bytes of
  // etp = 4, reduced over 4 times as many ranks); the bytes on the wire grow with the shard.
  const TimeBreakdown one = T("tp=4,dp=8,ep=2,sp=on,etp=1"), at_tp = T("tp=4,dp=8,ep=2,sp=on");
  EXPECT_GT(one.dp_comm_s, at_tp.dp_comm_s);
}

// The routed experts' grouped GEMM (docs/models.md §4.2): each local expert's last row tile runs
// part-empty (half of a 128-row tile on NVIDIA's GPUs), and few rows make its weight read the
// bound.
TEST(ExpertGemm, RowTilesAndTheWeightReadBoundFewRowsPerExpert) {
  ClusterSpec cluster = SmallCluster(1, 8);
  cluster.gpu = GpuPreset("h100");
  const CostModel cm(ModelPreset("mixtral-8x7b"), SmallTrain(8, 4096), cluster,
                     DefaultConstants("h100"));
  const double flops = 1e12, width = 14336;
  const double gemm = cm.GemmTime(flops, width);
  EXPECT_DOUBLE_EQ(cm.ExpertGemmTime(flops, width, 2048), gemm * (2048 + 64) / 2048.0);
  EXPECT_NEAR(cm.ExpertGemmTime(flops, width, 1e9), gemm, 1e-6 * gemm);
  // 16 rows: each BF16 weight (2 bytes) read for 2·16 FLOPs.
  EXPECT_DOUBLE_EQ(cm.ExpertGemmTime(flops, width, 16), cm.MemoryBoundTime(flops / 16));
  EXPECT_GT(cm.ExpertGemmTime(flops, width, 16), 2 * gemm);
  // Fewer rows, slower per FLOP, all the way down.
  double previous = 0;
  for (const double rows : {8192.0, 1024.0, 256.0, 64.0, 8.0}) {
    const double t = cm.ExpertGemmTime(flops, width, rows);
    EXPECT_GT(t, previous) << rows;
    previous = t;
  }
  // A family without a stated tile (the test GPU) pads nothing.
  const CostModel plain(ModelPreset("mixtral-8x7b"), SmallTrain(8, 4096), SmallCluster(1, 8),
                        PerfConstants{});
  EXPECT_DOUBLE_EQ(plain.ExpertGemmTime(flops, width, 2048), plain.GemmTime(flops, width));
}

// DeepSeek-V3's top-8 of 256 experts at 4096 tokens: 128 rows per expert without expert
// parallelism, 1024 at ep = 8. The same routed FLOPs per rank run faster at ep = 8.
TEST(ExpertGemm, ExpertParallelGivesEachExpertMoreRows) {
  ClusterSpec cluster = SmallCluster(4, 8);
  cluster.gpu = GpuPreset("h100");
  const CostModel cm(ModelPreset("deepseek-v3"), SmallTrain(256, 4096), cluster,
                     DefaultConstants("h100"));
  const double ep1 = cm.Time(Spec("tp=1,dp=32,ep=1", 32)).features[kGemm];
  const double ep8 = cm.Time(Spec("tp=1,dp=32,ep=8", 32)).features[kGemm];
  EXPECT_LT(ep8, 0.95 * ep1);
}

// Data-parallel overlap (ParallelConfig's knobs, Megatron's buckets): llama2-7b on 64 GPUs with
// tp=8, dp=8, so a rank holds ~840 M parameters in tensors of 2–11 M: 17 buckets, each closed
// once it holds Megatron's default 40 M.
struct DpOverlap : ::testing::Test {
  ModelSpec model = ModelPreset("llama2-7b");
  ClusterSpec cluster = SmallCluster(8, 8);
  CostModel cm{model, SmallTrain(64, 4096), cluster, PerfConstants{}};
  TimeBreakdown T(const std::string& spec) { return cm.Time(Spec(spec, 64)); }
};

TEST_F(DpOverlap, OnHidesTheReductionUnderTheBackwardOffExposesIt) {
  const TimeBreakdown on = T("tp=8,dp=8"), off = T("tp=8,dp=8,overlap_grad_reduce=off");
  EXPECT_EQ(off.grad_reduce_buckets, 0);
  EXPECT_EQ(on.grad_reduce_buckets, 17);
  // Off: everything shows. On: what the backward cannot hide, and at least the last bucket.
  EXPECT_DOUBLE_EQ(off.features[kDpComm], off.dp_comm_s);
  EXPECT_DOUBLE_EQ(on.dp_comm_s, off.dp_comm_s);
  EXPECT_LT(on.features[kDpComm], off.features[kDpComm]);
  EXPECT_GE(on.features[kDpComm], on.dp_comm_s / on.grad_reduce_buckets - 1e-15);
  EXPECT_GE(on.features[kDpComm], on.dp_comm_s * (1 - PerfConstants{}.eff.dp_overlap) - 1e-15);
  // The knobs change nothing but the DP term.
  for (int k = 0; k < kNumFeatures; ++k) {
    if (k != kDpComm) {
      EXPECT_EQ(on.features[k], off.features[k]) << FeatureName(k);
    }
  }
}

TEST_F(DpOverlap, OneBucketHidesNothing) {
  // A bucket as large as the rank's parameters: its reduction starts after the last gradient.
  PerfConstants k;
  k.stack.ddp_bucket_size = int64_t{1} << 40;
  const CostModel one(model, SmallTrain(64, 4096), cluster, k);
  const TimeBreakdown t = one.Time(Spec("tp=8,dp=8", 64));
  EXPECT_EQ(t.grad_reduce_buckets, 1);
  EXPECT_DOUBLE_EQ(t.features[kDpComm], t.dp_comm_s);
}

TEST_F(DpOverlap, ParamGatherOverlapsOnlyWhenOn) {
  const TimeBreakdown both = T("tp=8,dp=8,dist_opt=on");
  const TimeBreakdown no_gather = T("tp=8,dp=8,dist_opt=on,overlap_param_gather=off");
  const TimeBreakdown neither = T("tp=8,dp=8,dist_opt=on,overlap_grad_reduce=off");
  EXPECT_EQ(both.param_gather_buckets, 17);
  EXPECT_EQ(no_gather.param_gather_buckets, 0);
  EXPECT_EQ(neither.grad_reduce_buckets, 0);
  EXPECT_EQ(neither.param_gather_buckets, 0);  // Megatron needs --overlap-grad-reduce for it
  EXPECT_LT(both.features[kDpComm], no_gather.features[kDpComm]);
  EXPECT_LT(no_gather.features[kDpComm], neither.features[kDpComm]);
  EXPECT_DOUBLE_EQ(neither.features[kDpComm], neither.dp_comm_s);
}

TEST_F(DpOverlap, Bf16ReductionHalvesTheGradientBytes) {
  const TimeBreakdown fp32 = T("tp=8,dp=8,overlap_grad_reduce=off");
  const TimeBreakdown bf16 = T("tp=8,dp=8,overlap_grad_reduce=off,grad_reduce_dtype=bf16");
  const ParamCounts& p = cm.params();
  const double bytes = 4 *
                       (model.num_layers * static_cast<double>(p.dense_layer()) + p.embedding +
                        p.final_norm + p.output_layer) /
                       8;
  const double experts = cm.AllReduceTime(0, 8, 8);  // a dense model's empty expert reduction
  EXPECT_NEAR(fp32.dp_comm_s, cm.AllReduceTime(bytes, 8, 8) + experts, 1e-12);
  EXPECT_NEAR(bf16.dp_comm_s, cm.AllReduceTime(bytes / 2, 8, 8) + experts, 1e-12);
  // fp32 training (the CPU backend) reduces fp32 gradients whatever the knob says.
  TrainSpec fp32_train = SmallTrain(64, 4096);
  fp32_train.precision = Precision::kFP32;
  const CostModel fp32_model(model, fp32_train, cluster, PerfConstants{});
  EXPECT_EQ(fp32_model.Time(Spec("tp=8,dp=8,grad_reduce_dtype=bf16", 64)).dp_comm_s,
            fp32_model.Time(Spec("tp=8,dp=8", 64)).dp_comm_s);
}

TEST_F(DpOverlap, LaterPipelineStagesHaveOneBucketHiddenByTheDrain) {
  // pp = 2: the last stage's single bucket starts a backward slot before the first stage ends.
  const TimeBreakdown on = T("tp=8,pp=2,dp=4"), off = T("tp=8,pp=2,dp=4,overlap_grad_reduce=off");
  EXPECT_LT(on.features[kDpComm], off.features[kDpComm]);
  EXPECT_GE(on.features[kDpComm], on.dp_comm_s - on.backward_per_microbatch_s - 1e-12);
}

}  // namespace
}  // namespace autopar
