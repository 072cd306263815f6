#include <gtest/gtest.h>

#include <cmath>

#include "autopar/perf/accuracy.h"
#include "autopar/perf/cost_model.h"
#include "autopar/perf/ranking.h"
#include "autopar/spec/parse.h"
#include "space_test_util.h"

namespace autopar {
namespace {

using testing::SmallCluster;
using testing::SmallTrain;

TEST(Params, PublishedCounts) {
  EXPECT_NEAR(CountParams(ModelPreset("llama2-7b")).total() / 1e9, 6.74, 0.005);
  EXPECT_NEAR(CountParams(ModelPreset("llama2-70b")).total() / 1e9, 68.98, 0.005);
  EXPECT_NEAR(CountParams(ModelPreset("gpt3-175b")).total() / 1e9, 174.6, 0.1);
  EXPECT_NEAR(CountParams(ModelPreset("llama3-8b")).total() / 1e9, 8.03, 0.01);
  EXPECT_NEAR(CountParams(ModelPreset("llama3-405b")).total() / 1e9, 405.9, 1.0);
  // Mixtral 8x7B: 46.7 B in total, 12.9 B active per token. The published active count
  // includes the input embedding, which does no FLOPs and so is not in active().
  const ParamCounts mixtral = CountParams(ModelPreset("mixtral-8x7b"));
  EXPECT_NEAR(mixtral.total() / 1e9, 46.7, 0.1);
  EXPECT_NEAR((mixtral.active() + mixtral.embedding) / 1e9, 12.9, 0.05);
  // DeepSeek-V3: 671 B in total, 37 B activated (its 14 B multi-token-prediction module comes on
  // top and is not modelled).
  const ParamCounts dsv3 = CountParams(ModelPreset("deepseek-v3"));
  EXPECT_NEAR(dsv3.total() / 1e9, 671, 3);
  EXPECT_NEAR((dsv3.active() + dsv3.embedding) / 1e9, 37, 1.5);
}

// GPT-style layer with Korthikanti et al. 2022's assumptions: GeLU, ffn = 4h, MHA, dropout,
// no flash attention.
struct KorthikantiCase : ::testing::Test {
  ModelSpec model = ModelPreset("gpt3-175b");
  TrainSpec train = SmallTrain(64, 2048);
  ClusterSpec cluster = SmallCluster(8, 8);
  PerfConstants k;
  KorthikantiCase() {
    k.stack.flash_attention = false;
    k.stack.dropout = true;
  }
  // Activations without the backward pass's fixed buffers (2 full and 6 local [s·b, h] tensors).
  double Activations(const std::string& spec) {
    const CostModel cm(model, train, cluster, k);
    const ParallelConfig c = Complete(ParseSpec(spec), cluster.world_size());
    return cm.Memory(c).activations - 2 * Sbh() * (2 + 6.0 / (c.sp ? c.tp : 1));
  }
  // Bytes per layer per micro-batch of Korthikanti et al. (2022) eq. 2–6, for b = 1.
  double Sbh() const { return 1.0 * train.seq_length * model.hidden_size; }
  double Score(double t) const {
    return 5.0 * model.num_attention_heads * train.seq_length / (model.hidden_size * t);
  }
};

TEST_F(KorthikantiCase, TensorParallelWithoutSp) {
  // One micro-batch in flight with pp = 1; 96 layers.
  const double t = 8;
  // ... plus one layer's worth of gradients that the backward pass works on.
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1"), 97 * Sbh() * (10 + 24 / t + Score(t)), 1);
}

TEST_F(KorthikantiCase, SequenceParallel) {
  const double t = 8;
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on"), 97 * Sbh() * (34 / t + Score(t)), 1);
}

TEST_F(KorthikantiCase, SelectiveRecomputeDropsTheScoreTerm) {
  const double t = 8;
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on,recompute=selective"), 97 * Sbh() * 34 / t, 1);
}

// Selective recompute's other modules (Megatron's --recompute-modules) drop Korthikanti's terms
// of what they rerun, each rebuilt for one layer in its backward: layernorm the two norm outputs
// (2 + 2 sbh/t with SP), mlp the fc1 and GeLU outputs (8 + 8).
TEST_F(KorthikantiCase, RecomputedModulesDropTheirTerms) {
  const double t = 8;
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on,recompute=selective,"
                          "recompute_modules=core_attn+layernorm"),
              Sbh() * (96 * (34 - 4) + 34 + 4) / t, 1);
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on,recompute=selective,"
                          "recompute_modules=core_attn+layernorm+mlp"),
              Sbh() * (96 * (34 - 4 - 16) + 34 + 4 + 16) / t, 1);
  // Without core_attn the score term stays.
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on,recompute=selective,recompute_modules=layernorm"),
              Sbh() * (96 * (34 - 4 + Score(t) * t) + 34 + Score(t) * t + 4) / t, 1);
}

TEST_F(KorthikantiCase, FullRecomputeKeepsLayerInputsPlusOneLayer) {
  const double t = 8;
  const double one_layer = Sbh() * (34 / t + Score(t));
  // (the working set: the rebuilt layer and its gradients)
  EXPECT_NEAR(Activations("tp=8,pp=1,mbs=1,sp=on,recompute=full"),
              96 * 2 * Sbh() / t + 2 * one_layer, 1);
}

TEST_F(KorthikantiCase, PipelineKeepsPpMicrobatchesOnTheFirstStage) {
  // 1F1B: the first stage holds pp micro-batches of L/pp layers = L layers' worth;
  // interleaving multiplies that by 1 + (p − 1)/(p·v).
  const double t = 8;
  const double one_layer = Sbh() * (34 / t + Score(t));
  const double all_layers = 96 * one_layer;
  EXPECT_NEAR(Activations("tp=8,pp=8,mbs=1,sp=on"), all_layers + one_layer, 1);
  EXPECT_NEAR(Activations("tp=8,pp=8,vpp=2,mbs=1,sp=on"), all_layers * (1 + 7.0 / 16) + one_layer,
              1);
}

TEST(Memory, BytesPerParameterMatchMegatron) {
  // 18 bytes per parameter, or 6 + 12/d with the distributed optimizer over d replicas.
  const ModelSpec m = ModelPreset("llama2-7b");
  const ClusterSpec cluster = SmallCluster(1, 8);
  const CostModel cm(m, SmallTrain(64, 4096), cluster, PerfConstants{});
  const double params = static_cast<double>(CountParams(m).total());
  auto state_bytes = [&](const std::string& spec) {
    const MemoryBreakdown mem = cm.Memory(Complete(ParseSpec(spec), 8));
    return mem.weights + mem.gradients + mem.optimizer;
  };
  EXPECT_NEAR(state_bytes("tp=1,pp=1") / params, 18, 1e-9);
  EXPECT_NEAR(state_bytes("tp=1,pp=1,dist_opt=on") / params, 6 + 12.0 / 8, 1e-9);
  EXPECT_NEAR(state_bytes("tp=2,pp=1,dist_opt=on") / params, (6 + 12.0 / 4) / 2, 1e-9);
}

// The flash kernels' shape law (docs/models.md §4.2): half the long-call efficiency at
// `half_keys` keys, the head-dim factor 1 at 128; Hopper and Blackwell only.
TEST(Time, AttentionEfficiencyFollowsTheKernelShape) {
  const AttentionShapeLaw law = AttentionShapeLawOf("h100");
  EXPECT_DOUBLE_EQ(AttentionShapeFactor(law, law.half_keys, 128), 0.5);
  EXPECT_NEAR(AttentionShapeFactor(law, 1e12, 128), 1, 1e-9);
  EXPECT_LT(AttentionShapeFactor(law, 1e12, 64), 1);
  EXPECT_GT(AttentionShapeFactor(law, 1e12, 256), 1);
  EXPECT_LT(AttentionShapeFactor(law, 4096, 128), AttentionShapeFactor(law, 16384, 128));
  EXPECT_EQ(AttentionShapeFactor(AttentionShapeLawOf("cpu"), 64, 16), 1);
  EXPECT_EQ(AttentionShapeLawOf("a100-80gb").half_keys, 0);  // no published curve taken in
  EXPECT_EQ(AttentionShapeLawOf("GB200").half_keys, law.half_keys);

  // The same tokens at 16k: four times the keys per query, so four times the attention FLOPs, in
  // kernel calls nearer the long-call efficiency.
  const ModelSpec m = ModelPreset("llama2-7b");
  ClusterSpec cluster = SmallCluster(1, 8);
  cluster.gpu.name = "h100";
  const ParallelConfig c = Complete(ParseSpec("tp=8"), 8);
  const double at4k = CostModel(m, SmallTrain(8, 4096), cluster, DefaultConstants("h100"))
                          .Time(c)
                          .features[kAttention];
  const double at16k = CostModel(m, SmallTrain(2, 16384), cluster, DefaultConstants("h100"))
                           .Time(c)
                           .features[kAttention];
  const double flops_ratio = 4;  // same tokens, four times the keys per query
  EXPECT_NEAR(
      at16k / at4k,
      flops_ratio * AttentionShapeFactor(law, 4096, 128) / AttentionShapeFactor(law, 16384, 128),
      1e-9);
}

// Dropout in fused attention draws its mask in-kernel: cuDNN's (Transformer Engine's engine on
// Hopper and later) forward 2.15x, backward 1.19x; flash-attn 2's (the A100's) 1.17x and 1.14x;
// nothing elsewhere. Selective recompute runs the forward a second time at its own factor.
TEST(Time, AttentionDropoutCostsWhatTheFusedKernelMeasured) {
  const ModelSpec m = ModelPreset("llama2-7b");
  auto ratio = [&](const std::string& gpu, const char* spec) {
    ClusterSpec cluster = SmallCluster(1, 8);
    cluster.gpu.name = gpu;
    PerfConstants plain = DefaultConstants(gpu), dropout = plain;
    dropout.stack.dropout = true;
    const ParallelConfig c = Complete(ParseSpec(spec), 8);
    return CostModel(m, SmallTrain(8, 4096), cluster, dropout).Time(c).features[kAttention] /
           CostModel(m, SmallTrain(8, 4096), cluster, plain).Time(c).features[kAttention];
  };
  EXPECT_NEAR(ratio("h100", "tp=8"), (2.15 + 2.5 * 1.19) / 3.5, 1e-9);
  EXPECT_NEAR(ratio("h100", "tp=8,recompute=selective"), (2 * 2.15 + 2.5 * 1.19) / 4.5, 1e-9);
  EXPECT_NEAR(ratio("b200", "tp=8"), (2.15 + 2.5 * 1.19) / 3.5, 1e-9);
  EXPECT_NEAR(ratio("a100-80gb", "tp=8"), (1.17 + 2.5 * 1.14) / 3.5, 1e-9);
  EXPECT_DOUBLE_EQ(ratio("cpu", "tp=8"), 1);
}

TEST(Time, CollectivesUseTheLinkTheGroupCrosses) {
  const ClusterSpec cluster = SmallCluster(4, 8);
  PerfConstants k;
  k.eff.intra_node_bus = k.eff.inter_node_bus = 1;
  const CostModel cm(ModelPreset("llama2-7b"), SmallTrain(64, 4096), cluster, k);
  EXPECT_FALSE(cm.CrossesNodes(8, 1));   // tp = 8 inside a node
  EXPECT_TRUE(cm.CrossesNodes(4, 8));    // dp across the 4 nodes
  EXPECT_TRUE(cm.CrossesNodes(4, 4));    // two nodes, two members each
  EXPECT_FALSE(cm.CrossesNodes(2, 4));
  const double bytes = 1e9;
  // Ring all-reduce: 2(n−1)/n · bytes / bandwidth + latency steps.
  EXPECT_NEAR(cm.AllReduceTime(bytes, 8, 1), 2 * 7.0 / 8 * bytes / 300e9, 1e-4);
  EXPECT_NEAR(cm.AllReduceTime(bytes, 4, 8), 2 * 3.0 / 4 * bytes / 25e9, 1e-3);
  EXPECT_NEAR(cm.AllGatherTime(bytes, 8, 1), 7.0 / 8 * bytes / 300e9, 1e-4);
  EXPECT_EQ(cm.AllReduceTime(bytes, 1, 1), 0);
}

// GB200 NVL72 launched as torchrun sees it: 18 trays ("nodes") of 4 GPUs, one 72-GPU NVLink
// domain. Groups between trays of the rack are costed on NVLink; an 8-GPU HGX node's are not.
TEST(Time, CollectivesInsideAnNvlinkDomainSpanningNodesStayOnNvlink) {
  const ModelSpec model = ModelPreset("llama2-70b");
  const TrainSpec train = SmallTrain(512, 4096);
  PerfConstants k;
  k.eff.intra_node_bus = k.eff.inter_node_bus = 1;
  const ClusterSpec rack{18, 4, GpuPreset("gb200")};
  ClusterSpec trays_only = rack;  // the same trays without the rack's NVLink switches
  trays_only.gpu.nvlink_domain_gpus = 0;
  const CostModel nvl72(model, train, rack, k);
  const CostModel separate(model, train, trays_only, k);
  const double bytes = 1e9, nvlink = 900e9, nic = 50e9;
  const double a_nvl = rack.gpu.intra_node_latency_s, a_net = rack.gpu.inter_node_latency_s;

  // tp = 8 over two trays: NVLink in the rack, the network between separate trays (4 members a
  // tray, one NIC each).
  EXPECT_FALSE(nvl72.CrossesNodes(8, 1));
  EXPECT_TRUE(separate.CrossesNodes(8, 1));
  EXPECT_NEAR(nvl72.AllReduceTime(bytes, 8, 1), 2 * 7.0 / 8 * bytes / nvlink + 8 * a_nvl, 1e-9);
  EXPECT_NEAR(separate.AllReduceTime(bytes, 8, 1), 2 * 7.0 / 8 * bytes / (4 * nic) + 8 * a_net,
              1e-9);
  // A dp group of 9 at stride 8 spans all 18 trays: still one domain.
  EXPECT_FALSE(nvl72.CrossesNodes(9, 8));
  EXPECT_NEAR(nvl72.AllGatherTime(bytes, 9, 8), 8.0 / 9 * bytes / nvlink + 8 * a_nvl, 1e-9);
  // An all-to-all of 16 ranks inside the rack: all peers on NVLink.
  EXPECT_NEAR(nvl72.AllToAllTime(bytes, 16, 1), 15.0 / 16 * bytes / nvlink + a_nvl, 1e-9);
  // Blocks that do not divide 72 straddle two domains on two racks; pipeline p2p across racks.
  const ClusterSpec racks{36, 4, GpuPreset("gb200")};
  const CostModel two(model, train, racks, k);
  EXPECT_TRUE(two.CrossesNodes(16, 1));
  EXPECT_FALSE(two.CrossesNodes(8, 1));
  EXPECT_TRUE(two.CrossesNodes(2, 72));  // pp = 2, one stage a rack
  // dp = 18 at stride 8 over both racks: 9 members a rack, each with its NIC.
  EXPECT_NEAR(two.AllReduceTime(bytes, 18, 8), 2 * 17.0 / 18 * bytes / (9 * nic) + 12 * a_net,
              1e-9);

  // The same tp = 8 on 8-GPU H100 nodes is NVLink; tp = 16 leaves the node for the network.
  const ClusterSpec hgx{4, 8, GpuPreset("h100")};
  const CostModel h100(model, train, hgx, k);
  EXPECT_FALSE(h100.CrossesNodes(8, 1));
  EXPECT_TRUE(h100.CrossesNodes(16, 1));
  const GpuSpec& h = hgx.gpu;
  EXPECT_NEAR(h100.AllReduceTime(bytes, 16, 1),
              2 * 15.0 / 16 * bytes / (8 * h.inter_node_bandwidth) + 10 * h.inter_node_latency_s,
              1e-9);

  // In a whole step: tp = 8 (SP) on the rack pays NVLink, not the trays' NICs.
  const ParallelConfig c = Complete(ParseSpec("tp=8,pp=1,sp=on,mbs=1"), rack.world_size());
  const double tp_rack = nvl72.Time(c).features[kTpComm];
  const double tp_trays = separate.Time(c).features[kTpComm];
  EXPECT_GT(tp_rack, 0);
  EXPECT_LT(tp_rack * 3, tp_trays);
}

TEST(Time, PipelineScheduleFactors) {
  // Step time components scale with the schedule's slots: m + (p − 1)/v.
  const ClusterSpec cluster = SmallCluster(1, 8);
  const CostModel cm(ModelPreset("llama2-7b"), SmallTrain(64, 4096), cluster, PerfConstants{});
  const TimeBreakdown one_f_one_b = cm.Time(Complete(ParseSpec("tp=1,pp=8,mbs=1"), 8));
  EXPECT_EQ(one_f_one_b.microbatches, 64);
  EXPECT_NEAR(one_f_one_b.bubble_fraction, 7.0 / (64 + 7), 1e-12);
  const double per_slot = one_f_one_b.forward_per_microbatch_s + one_f_one_b.backward_per_microbatch_s;
  double compute = 0;
  for (int k : {kGemm, kAttention, kMemoryBound, kTpComm}) compute += one_f_one_b.features[k];
  EXPECT_NEAR(compute, (64 + 7) * per_slot, 1e-9 * compute);
  const TimeBreakdown interleaved = cm.Time(Complete(ParseSpec("tp=1,pp=8,vpp=2,mbs=1"), 8));
  EXPECT_NEAR(interleaved.bubble_fraction, 3.5 / (64 + 3.5), 1e-12);
  EXPECT_LT(interleaved.features[kGemm], one_f_one_b.features[kGemm]);
  EXPECT_GT(interleaved.features[kPpComm], one_f_one_b.features[kPpComm]);
}

TEST(Time, StepTimeIsTheSumOfFeaturesAndRecomputeCosts) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  const CostModel cm(ModelPreset("llama2-7b"), SmallTrain(64, 4096), cluster, PerfConstants{});
  const TimeBreakdown none = cm.Time(Complete(ParseSpec("tp=2,pp=2,sp=on"), 8));
  double sum = 0;
  for (double x : none.features) sum += x;
  EXPECT_DOUBLE_EQ(sum, none.step_time_s);
  const TimeBreakdown selective = cm.Time(Complete(ParseSpec("tp=2,pp=2,sp=on,recompute=selective"), 8));
  const TimeBreakdown full = cm.Time(Complete(ParseSpec("tp=2,pp=2,sp=on,recompute=full"), 8));
  EXPECT_LT(none.step_time_s, selective.step_time_s);
  EXPECT_LT(selective.step_time_s, full.step_time_s);
  // Full recompute repeats the forward: GEMM time grows by a third (fwd 1 + bwd 2 → 4 of 3).
  EXPECT_NEAR(full.features[kGemm] / none.features[kGemm], 4.0 / 3, 0.02);
}

// Selective recompute's modules rerun their forward in backward: a MoE layer (moe) its GEMMs and
// the token dispatcher's all-to-alls, as full recompute does, but not the attention's; the norms
// (layernorm) only memory-bound passes.
TEST(Time, RecomputedModulesRunTheirForwardAgain) {
  const ClusterSpec cluster = SmallCluster(2, 8);
  const CostModel cm(ModelPreset("mixtral-8x7b"), SmallTrain(64, 4096), cluster, PerfConstants{});
  auto time = [&](const std::string& recompute) {
    return cm.Time(Complete(ParseSpec("tp=2,pp=4,ep=2,sp=on," + recompute), 16));
  };
  const TimeBreakdown none = time("recompute=none");
  const TimeBreakdown core = time("recompute=selective");
  const TimeBreakdown moe = time("recompute=selective,recompute_modules=core_attn+moe");
  const TimeBreakdown norms = time("recompute=selective,recompute_modules=core_attn+layernorm");
  const TimeBreakdown full = time("recompute=full");
  // The all-to-alls: forward + backward, and the forward once more.
  EXPECT_NEAR(moe.features[kEpComm] / core.features[kEpComm], 1.5, 1e-9);
  EXPECT_NEAR(full.features[kEpComm] / none.features[kEpComm], 1.5, 1e-9);
  EXPECT_GT(moe.features[kGemm], core.features[kGemm]);
  EXPECT_LT(moe.features[kGemm] - core.features[kGemm],
            full.features[kGemm] - none.features[kGemm]);
  EXPECT_EQ(moe.features[kAttention], core.features[kAttention]);
  EXPECT_GT(norms.features[kMemoryBound], core.features[kMemoryBound]);
  for (Feature f : {kGemm, kAttention, kEpComm, kTpComm}) {
    EXPECT_EQ(norms.features[f], core.features[f]) << f;
  }
  EXPECT_LT(core.step_time_s, moe.step_time_s);
  EXPECT_LT(moe.step_time_s, full.step_time_s);
}

// Megatron's flex dispatcher sends a token once per rank holding its experts: Mixtral's top-2
// of 8 over ep 2 reaches 2·(1 − (4/8)·(3/7)) = 1.571 ranks a token, not 2; over ep 8 (one
// expert a rank) there is nothing to deduplicate. The compute is the same.
TEST(Time, FlexDispatcherSendsATokenOncePerRankHoldingItsExperts) {
  const ClusterSpec cluster = SmallCluster(2, 8);
  const CostModel cm(ModelPreset("mixtral-8x7b"), SmallTrain(64, 4096), cluster, PerfConstants{});
  auto ep_ratio = [&](const std::string& spec) {
    const TimeBreakdown all = cm.Time(Complete(ParseSpec(spec), 16));
    const TimeBreakdown flex = cm.Time(Complete(ParseSpec(spec + ",dispatcher=flex"), 16));
    EXPECT_EQ(flex.features[kGemm], all.features[kGemm]) << spec;
    EXPECT_LT(flex.features[kMemoryBound], all.features[kMemoryBound] + 1e-12) << spec;
    return flex.features[kEpComm] / all.features[kEpComm];
  };
  const double two = ep_ratio("tp=2,pp=4,ep=2,sp=on");
  EXPECT_LT(two, 1.0);
  EXPECT_NEAR(two, 2 * (1 - 4.0 / 8 * 3.0 / 7) / 2, 0.03);  // the counts' latency aside
  EXPECT_NEAR(ep_ratio("tp=1,pp=2,ep=8"), 1.0, 1e-12);
}

// --tp-comm-overlap (Transformer Engine's userbuffers): with sequence parallelism the forward
// exposes the last of 4 pipelined chunks of each reduce-scatter and the SMs the rest take from
// the GEMMs; the backward only those SMs; without sp (Megatron refuses the flag there) or at
// tp = 1 nothing changes. A MoE layer overlaps its attention block's pair only.
TEST(Time, TpCommOverlapHidesTheTensorParallelCollectivesUnderTheGemms) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  // Against a stack that exposes every backward collective (the asynchronous backward is
  // Time.AsyncTpBackward...).
  PerfConstants exposed;
  exposed.stack.async_tp_backward = false;
  PerfConstants overlapped = exposed;
  overlapped.stack.tp_comm_overlap = true;
  const ModelSpec model = ModelPreset("llama2-7b");
  const CostModel plain(model, SmallTrain(64, 4096), cluster, exposed);
  const CostModel ub(model, SmallTrain(64, 4096), cluster, overlapped);
  const TimeBreakdown sp = plain.Time(Complete(ParseSpec("tp=8,sp=on,mbs=1"), 8));
  const TimeBreakdown sp_ub = ub.Time(Complete(ParseSpec("tp=8,sp=on,mbs=1"), 8));
  // Four collectives of equal time a direction, two of them reduce-scatters: forward exposes
  // 2·(1/4 + 16/132·3/4) of 4, backward 2·16/132 of 4 (the GEMMs are long enough to hide them).
  const double share = 16.0 / 132;
  const double forward = 2 * (0.25 + share * 0.75) / 4, backward = 2 * share / 4;
  const double last_stage_gathers =
      2 * plain.AllGatherTime(2.0 * 4096 * model.hidden_size, 8, 1) * sp.microbatches;
  EXPECT_NEAR(
      (sp_ub.features[kTpComm] - last_stage_gathers) / (sp.features[kTpComm] - last_stage_gathers),
      (forward + backward) / 2, 1e-6);
  EXPECT_LT(sp_ub.step_time_s, sp.step_time_s);
  for (const char* spec : {"tp=8,sp=off", "tp=1,dp=8"}) {
    const ParallelConfig c = Complete(ParseSpec(spec), 8);
    EXPECT_EQ(ub.Time(c).step_time_s, plain.Time(c).step_time_s) << spec;
  }
  const ModelSpec moe = ModelPreset("mixtral-8x7b");
  const CostModel moe_plain(moe, SmallTrain(64, 4096), cluster, exposed);
  const CostModel moe_ub(moe, SmallTrain(64, 4096), cluster, overlapped);
  const ParallelConfig c = Complete(ParseSpec("tp=8,ep=1,sp=on,mbs=1"), 8);
  const double moe_hidden = moe_plain.Time(c).features[kTpComm] - moe_ub.Time(c).features[kTpComm];
  const double dense_hidden = sp.features[kTpComm] - sp_ub.features[kTpComm];
  EXPECT_GT(moe_hidden, 0);
  // Half the pairs, of the same size (mixtral has llama2-7b's hidden size and layers).
  EXPECT_NEAR(moe_hidden / dense_hidden, 0.5, 0.1);
}

// Megatron's asynchronous tensor-parallel backward: the input-gradient all-reduce of QKV and fc1
// (reduce-scatter with SP) runs under their weight-gradient GEMMs and, with SP, the re-gather of
// their inputs under their input-gradient GEMMs. Where those GEMMs are long (gpt3-175b at tp = 2)
// each overlapped collective exposes only the SMs it takes from the GEMM (16 of 132); the output
// gradients' all-gathers (SP) stay exposed; the forward does not change; tp = 1 has nothing.
TEST(Time, AsyncTpBackwardHidesColumnParallelCollectivesUnderTheirGemms) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  PerfConstants exposed;
  exposed.stack.async_tp_backward = false;
  const ModelSpec model = ModelPreset("gpt3-175b");
  const CostModel async(model, SmallTrain(64, 2048), cluster, PerfConstants{});
  const CostModel plain(model, SmallTrain(64, 2048), cluster, exposed);
  const double share = 16.0 / 132, layers = static_cast<double>(model.num_layers);
  const double act_bytes = 2.0 * 2048 * model.hidden_size;  // bf16, mbs 1
  {  // without SP: two all-reduces a direction; the backward's two run beside their GEMMs
    const ParallelConfig c = Complete(ParseSpec("tp=2,sp=off,mbs=1"), 8);
    const TimeBreakdown on = async.Time(c), off = plain.Time(c);
    const double all_reduce = plain.AllReduceTime(act_bytes, 2, 1) * off.microbatches * layers;
    EXPECT_NEAR(off.features[kTpComm], 4 * all_reduce, 1e-9 * all_reduce);
    EXPECT_NEAR(on.features[kTpComm], (2 + 2 * share) * all_reduce, 1e-9 * all_reduce);
  }
  {  // with SP: the backward's two reduce-scatters and two re-gathers (new) beside their GEMMs
    const ParallelConfig c = Complete(ParseSpec("tp=2,sp=on,mbs=1"), 8);
    const TimeBreakdown on = async.Time(c), off = plain.Time(c);
    const double gather = plain.AllGatherTime(act_bytes, 2, 1) * off.microbatches * layers;
    EXPECT_NEAR(off.features[kTpComm] - on.features[kTpComm], (2 - 4 * share) * gather,
                1e-9 * gather);
    EXPECT_LT(on.step_time_s, off.step_time_s);
  }
  const ParallelConfig tp1 = Complete(ParseSpec("tp=1,dp=8"), 8);
  EXPECT_EQ(async.Time(tp1).step_time_s, plain.Time(tp1).step_time_s);
}

// Megatron's cross-entropy: the fused loss (--cross-entropy-loss-fusion) moves 24 bytes a
// logit less than the unfused one (forward e + 20 against e + 36, backward 4 + e against 12 + e).
TEST(Time, FusedCrossEntropyMovesFewerBytes) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  PerfConstants fused;
  fused.stack.cross_entropy_fusion = true;
  const ModelSpec model = ModelPreset("llama3-8b");
  const CostModel plain(model, SmallTrain(64, 4096), cluster, PerfConstants{});
  const CostModel fewer(model, SmallTrain(64, 4096), cluster, fused);
  const ParallelConfig c = Complete(ParseSpec("tp=2,pp=1,mbs=1,sp=on"), 8);
  const TimeBreakdown a = plain.Time(c), b = fewer.Time(c);
  const double hbm = cluster.gpu.hbm_bandwidth * PerfConstants{}.eff.memory_bound;
  const double logits =
      4096.0 * static_cast<double>(model.vocab_size) / 2;  // one micro-batch, tp 2
  EXPECT_NEAR(a.features[kMemoryBound] - b.features[kMemoryBound],
              static_cast<double>(a.microbatches) * 24 * logits / hbm, 1e-9);
  EXPECT_EQ(a.features[kGemm], b.features[kGemm]);
}

TEST(Time, Fp32MovesTwiceTheBytes) {
  // The CPU backend trains in fp32: elementwise traffic and activation collectives carry 4-byte
  // elements, so with equal peaks only the byte-bound components change, by 2× (the
  // cross-entropy's FP32 passes of the last stage excepted: 36 of its e + 36 bytes a logit
  // forward, 12 of e + 12 backward).
  const ClusterSpec cluster = SmallCluster(1, 8);
  TrainSpec bf16 = SmallTrain(64, 4096), fp32 = bf16;
  fp32.precision = Precision::kFP32;
  ClusterSpec same_peak = cluster;
  same_peak.gpu.peak_flops_fp32 = same_peak.gpu.peak_flops_bf16;
  const CostModel half(ModelPreset("llama2-7b"), bf16, same_peak, PerfConstants{});
  const CostModel full(ModelPreset("llama2-7b"), fp32, same_peak, PerfConstants{});
  const ParallelConfig c = Complete(ParseSpec("tp=2,pp=2,sp=on"), 8);
  const TimeBreakdown a = half.Time(c), b = full.Time(c);
  EXPECT_DOUBLE_EQ(b.features[kGemm], a.features[kGemm]);
  EXPECT_GT(b.features[kMemoryBound], 1.8 * a.features[kMemoryBound]);
  EXPECT_LE(b.features[kMemoryBound], 2 * a.features[kMemoryBound]);
  EXPECT_GT(b.features[kTpComm], 1.9 * a.features[kTpComm]);
  EXPECT_GT(b.features[kPpComm], 1.9 * a.features[kPpComm]);
}

TEST(Rank, KeepsTheFastestThatFitInOrder) {
  const ModelSpec m = ModelPreset("llama2-7b");
  const ClusterSpec cluster = SmallCluster(1, 8);
  const TrainSpec train = SmallTrain(64, 4096);
  const SearchSpace space(m, train, cluster, {});
  const CostModel cm(m, train, cluster, PerfConstants{});
  const Ranking r = RankSpace(space, cm, 10);
  EXPECT_EQ(r.candidates, space.Count());
  ASSERT_EQ(r.top.size(), 10u);
  double best_brute = 1e30;
  space.ForEach([&](const ParallelConfig& c) {
    const Estimate e = cm.Evaluate(c);
    if (e.fits) best_brute = std::min(best_brute, e.time.step_time_s);
  });
  EXPECT_DOUBLE_EQ(r.top[0].estimate.time.step_time_s, best_brute);
  for (size_t i = 1; i < r.top.size(); ++i) {
    EXPECT_LE(r.top[i - 1].estimate.time.step_time_s, r.top[i].estimate.time.step_time_s);
    EXPECT_TRUE(r.top[i].estimate.fits);
  }
}

// The spread a prediction carries is the benchmark's error on the published runs that resemble
// it: by software stack first (unfused attention is the 2020-2022 stack), then by precision.
TEST(PredictionSpread, FollowsTheRunsTheBenchmarkMeasured) {
  TrainSpec t{256, 4096};
  StackOptions stack;
  const PredictionSpread today = SpreadOf(t, stack);
  EXPECT_EQ(today.rows, 17);
  EXPECT_NEAR(today.relative, 0.083, 1e-12);
  t.precision = Precision::kFP8;
  EXPECT_EQ(SpreadOf(t, stack).rows, 17);
  stack.flash_attention = false;
  t.precision = Precision::kFP16;
  EXPECT_EQ(SpreadOf(t, stack).rows, 35);
  EXPECT_LT(SpreadOf(t, stack).relative, today.relative);
  t.precision = Precision::kFP32;  // the CPU backend: nothing published to rest on
  EXPECT_EQ(SpreadOf(t, stack).rows, 0);
}

}  // namespace
}  // namespace autopar
