// Which process groups a configuration connects, and how fp8 trials are set up or refused: pure
// decisions of src/trial, tested without MPI or a GPU.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "autopar/spec/parse.h"
#include "src/trial/groups.h"
#include "src/trial/linear.h"

namespace autopar::trial {
namespace {

using device::Fp8Operand;

ParallelConfig Config(int tp, int pp, int dp, int cp = 1, int up = 1, int ep = 1) {
  ParallelConfig c;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.cp = cp;
  c.up = up;
  c.ep = ep;
  return c;
}

TEST(UsedGroups, DenseModelsConnectNoExpertGroups) {
  const GroupUse use = UsedGroups(Config(2, 2, 2), /*moe=*/false, /*tied_embedding=*/false);
  EXPECT_TRUE(use.tp);
  EXPECT_TRUE(use.pp);
  EXPECT_TRUE(use.dp);
  EXPECT_FALSE(use.up);
  EXPECT_FALSE(use.cp);
  EXPECT_FALSE(use.ep);
  EXPECT_FALSE(use.edp);
  EXPECT_FALSE(use.seq);
  EXPECT_FALSE(use.embedding);  // untied: the output layer has weights of its own
}

TEST(UsedGroups, GroupsOfOneRankAreNotConnected) {
  EXPECT_EQ(UsedGroups(Config(1, 1, 1), true, true), GroupUse{});
  const GroupUse use = UsedGroups(Config(1, 1, 4), false, true);
  EXPECT_TRUE(use.dp);
  EXPECT_FALSE(use.tp);
  EXPECT_FALSE(use.pp);
  EXPECT_FALSE(use.embedding);  // tied, but pp = 1: one stage holds both ends
}

TEST(UsedGroups, ReplicasCountUlyssesAndContextRanks) {
  // dp = 1, but cp and up ranks hold the same dense weights.
  const GroupUse use = UsedGroups(Config(1, 1, 1, /*cp=*/2, /*up=*/2), false, false);
  EXPECT_TRUE(use.dp);
  EXPECT_TRUE(use.cp);
  EXPECT_TRUE(use.up);
}

TEST(UsedGroups, MixtureOfExpertsConnectsExpertAndSampleGroups) {
  GroupUse use = UsedGroups(Config(2, 1, 4, 1, 1, /*ep=*/4), /*moe=*/true, false);
  EXPECT_TRUE(use.ep);
  EXPECT_FALSE(use.edp);  // dp / ep = 1 replica of each expert
  EXPECT_TRUE(use.seq);   // tp = 2 ranks per sample share the router statistics
  use = UsedGroups(Config(1, 1, 4, 1, 1, /*ep=*/2), true, false);
  EXPECT_TRUE(use.ep);
  EXPECT_TRUE(use.edp);
  EXPECT_FALSE(use.seq);  // one rank per sample
  use = UsedGroups(Config(1, 1, 4, 1, 1, /*ep=*/1), true, false);
  EXPECT_FALSE(use.ep);
  EXPECT_TRUE(use.edp);
}

TEST(UsedGroups, ExpertTensorGroupOnlyWhereItIsNotTheTpGroup) {
  ParallelConfig c = Config(2, 1, 2, 1, 1, /*ep=*/2);
  EXPECT_FALSE(UsedGroups(c, true, false).etp);  // etp = tp: the experts use the tp group
  c.etp = 1;
  GroupUse use = UsedGroups(c, true, false);
  EXPECT_FALSE(use.etp);
  EXPECT_TRUE(use.ep);
  EXPECT_TRUE(use.edp);  // tp·dp / (etp·ep) = 2 replicas of each expert
  c = Config(1, 1, 4, 1, 1, /*ep=*/2);
  c.etp = 2;
  use = UsedGroups(c, true, false);
  EXPECT_TRUE(use.etp);
  EXPECT_FALSE(use.edp);  // 4 / (2·2)
  EXPECT_FALSE(UsedGroups(c, false, false).etp);
}

// The expert grid (etp-ep-edp over q = tp + TP·(cp + CP·dp) of each up slice) and, at etp = tp,
// the earlier layout: ep groups of consecutive k = cp + CP·dp.
TEST(Coordinates, ExpertGridFoldsOverTpCpAndDp) {
  ParallelConfig c = Config(2, 1, 2, 1, 1, /*ep=*/2);
  c.etp = 1;
  for (int rank = 0; rank < 4; ++rank) {
    const Coordinates at = Coordinates::Of(rank, c);
    EXPECT_EQ(at.etp, 0);
    EXPECT_EQ(at.ep, rank % 2) << rank;  // the two tp ranks of a dp rank hold different experts
    EXPECT_EQ(at.edp, rank / 2) << rank;
  }
  c = Config(1, 1, 4, 1, 1, /*ep=*/2);
  c.etp = 2;
  for (int rank = 0; rank < 4; ++rank) {
    const Coordinates at = Coordinates::Of(rank, c);
    EXPECT_EQ(at.etp, rank % 2) << rank;  // etp over two dp ranks
    EXPECT_EQ(at.ep, rank / 2) << rank;
    EXPECT_EQ(at.edp, 0) << rank;
  }
  // etp = tp with Ulysses, cp and pipelines: what the layout was before etp existed.
  c = Config(2, 2, 4, /*cp=*/2, /*up=*/2, /*ep=*/4);
  for (int rank = 0; rank < 64; ++rank) {
    const Coordinates at = Coordinates::Of(rank, c);
    const int k = at.cp + c.cp * at.dp;
    EXPECT_EQ(at.etp, at.tp) << rank;
    EXPECT_EQ(at.ep, k % c.ep) << rank;
    EXPECT_EQ(at.edp, at.up + c.up * (k / c.ep)) << rank;
  }
}

TEST(UsedGroups, TiedEmbeddingsOverStagesConnectTheEndStages) {
  EXPECT_TRUE(UsedGroups(Config(1, 4, 1), false, true).embedding);
  EXPECT_FALSE(UsedGroups(Config(1, 4, 1), false, false).embedding);
}

TEST(Fp8Unsupported, RefusesDevicesWithoutFp8NamingTheFlag) {
  EXPECT_EQ(Fp8Unsupported(false, false, "cpu"), "");
  EXPECT_EQ(Fp8Unsupported(true, true, "cuda:0 (NVIDIA H100 80GB HBM3)"), "");
  const std::string cpu = Fp8Unsupported(true, false, "cpu");
  EXPECT_NE(cpu.find("--fp8-format"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("cpu"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("--backend cuda"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("8.9"), std::string::npos) << cpu;
  const std::string a100 = Fp8Unsupported(true, false, "cuda:0 (NVIDIA A100-SXM4-80GB)");
  EXPECT_NE(a100.find("A100"), std::string::npos) << a100;
}

ModelSpec SmallModel() {
  ModelSpec m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.num_query_groups = 4;
  m.ffn_hidden_size = 256;
  m.vocab_size = 128;
  m.max_position_embeddings = 64;
  return m;
}

// What Megatron-LM refuses, the trial runner refuses too, whatever its code could run.
TEST(Unsupported, AllGatheredKeysNeedTheRingAlone) {
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = 64;
  EXPECT_EQ(Unsupported(SmallModel(), t, ParseSpec("cp=2,cp_comm=allgather")), "");
  for (const char* spec : {"cp=2,up=2,cp_comm=allgather", "up=2,cp_comm=allgather"}) {
    EXPECT_NE(Unsupported(SmallModel(), t, ParseSpec(spec)).find("cp_comm=allgather needs"),
              std::string::npos)
        << spec;
  }
}

TEST(Fp8Shapes, HybridPutsGradientsInE5M2) {
  const MegatronArgs args = ApplyMegatronFlags(
      {"--global-batch-size", "8", "--seq-length", "64", "--bf16", "--fp8-format", "hybrid"},
      ModelSpec(), TrainSpec());
  EXPECT_EQ(args.train.precision, Precision::kFP8);
  EXPECT_EQ(args.train.fp8_format, TrainSpec::Fp8Format::kHybrid);
  const Shapes s = Shapes::Of(SmallModel(), args.train, Config(1, 1, 1), Coordinates{});
  EXPECT_TRUE(s.fp8.on());
  EXPECT_EQ(s.fp8.fwd, Fp8Operand::kE4M3);
  EXPECT_EQ(s.fp8.grad, Fp8Operand::kE5M2);
}

TEST(Fp8Shapes, E4M3PutsEverythingInE4M3AndBf16NothingInFp8) {
  const MegatronArgs args =
      ApplyMegatronFlags({"--global-batch-size", "8", "--seq-length", "64", "--fp8-format", "e4m3"},
                         ModelSpec(), TrainSpec());
  EXPECT_EQ(args.train.fp8_format, TrainSpec::Fp8Format::kE4M3);
  Shapes s = Shapes::Of(SmallModel(), args.train, Config(1, 1, 1), Coordinates{});
  EXPECT_EQ(s.fp8.fwd, Fp8Operand::kE4M3);
  EXPECT_EQ(s.fp8.grad, Fp8Operand::kE4M3);
  TrainSpec bf16 = args.train;
  bf16.precision = Precision::kBF16;
  s = Shapes::Of(SmallModel(), bf16, Config(1, 1, 1), Coordinates{});
  EXPECT_FALSE(s.fp8.on());
  EXPECT_EQ(s.fp8.grad, Fp8Operand::kNone);
}

// The stage at `stage` of `spec` for a model of `layers` layers: its layers per chunk and the
// global index of each chunk's first layer.
Shapes StageShapes(const char* spec, int64_t layers, int stage) {
  ModelSpec m = SmallModel();
  m.num_layers = layers;
  TrainSpec t;
  t.global_batch_size = 8;
  t.seq_length = 64;
  Coordinates at;
  at.pp = stage;
  return Shapes::Of(m, t, ParseSpec(spec), at);
}

TEST(StageShapes, UnevenStagesHoldTheirOwnLayers) {
  using Firsts = std::vector<int64_t>;
  // 1F1B, 1+2+2+1 layers.
  const char* four = "pp=4,dp=1,pp_first=1,pp_last=1";
  const int64_t counts[] = {1, 2, 2, 1}, firsts[] = {0, 1, 3, 5};
  for (int stage = 0; stage < 4; ++stage) {
    const Shapes s = StageShapes(four, 6, stage);
    EXPECT_EQ(s.layers_per_chunk, counts[stage]) << stage;
    EXPECT_EQ(s.chunk_first_layer, Firsts{firsts[stage]}) << stage;
  }
  // Interleaved, 2+4 layers in chunks of 1 and 2: stage 0 holds layers 0 and 3, stage 1 layers
  // 1-2 and 4-5 (chunk-major, as Megatron-core's get_transformer_layer_offset).
  const Shapes first = StageShapes("pp=2,dp=1,vpp=2,pp_first=2", 6, 0);
  const Shapes last = StageShapes("pp=2,dp=1,vpp=2,pp_first=2", 6, 1);
  EXPECT_EQ(first.layers_per_chunk, 1);
  EXPECT_EQ(first.chunk_first_layer, (Firsts{0, 3}));
  EXPECT_EQ(last.layers_per_chunk, 2);
  EXPECT_EQ(last.chunk_first_layer, (Firsts{1, 4}));
  EXPECT_EQ(last.GlobalLayer(1, 1), 5);
  // The embedding and the loss counted in the split (Qwen3-235B's recipe: 94 layers over pp 8 ×
  // vpp 4): the first chunk of the first stage and the last of the last hold 2 layers, the
  // others 3.
  const Shapes head = StageShapes("pp=8,dp=1,vpp=4,split_embedding=on,split_loss=on", 94, 0);
  const Shapes tail = StageShapes("pp=8,dp=1,vpp=4,split_embedding=on,split_loss=on", 94, 7);
  EXPECT_EQ(head.chunk_layers, (Firsts{2, 3, 3, 3}));
  EXPECT_EQ(head.chunk_first_layer, (Firsts{0, 23, 47, 71}));
  EXPECT_EQ(tail.chunk_layers, (Firsts{3, 3, 3, 2}));
  EXPECT_EQ(tail.chunk_first_layer, (Firsts{20, 44, 68, 92}));
  EXPECT_EQ(head.layers_per_chunk, 3);
  // The even split is what it was: layers / (pp·vpp) per chunk.
  const Shapes even = StageShapes("pp=2,dp=1,vpp=2", 8, 1);
  EXPECT_EQ(even.layers_per_chunk, 2);
  EXPECT_EQ(even.chunk_first_layer, (Firsts{2, 6}));
}

// Walking the virtual stages in pipeline order (chunk-major: chunk 0 of every stage, then chunk
// 1, ...) meets every global layer once, in order, whatever the split.
TEST(StageShapes, VirtualStagesInPipelineOrderCoverEveryLayerOnce) {
  const std::pair<const char*, int64_t> cases[] = {{"pp=4,dp=1,pp_first=1,pp_last=1", 6},
                                                   {"pp=2,dp=1,pp_first=1", 4},
                                                   {"pp=2,dp=1,vpp=2,pp_last=2", 6},
                                                   {"pp=3,dp=1,vpp=2,pp_first=2,pp_last=4", 12},
                                                   {"pp=4,dp=1,vpp=3", 24},
                                                   {"pp=16,dp=1,pp_first=1", 61},
                                                   {"pp=2,dp=1,vpp=2,split_embedding=on", 7},
                                                   {"pp=4,dp=1,vpp=2,split_loss=on", 15},
                                                   {"pp=8,dp=1,vpp=4,split_embedding=on,"
                                                    "split_loss=on",
                                                    94}};
  for (const auto& [spec, layers] : cases) {
    const ParallelConfig c = ParseSpec(spec);
    int64_t next = 0;
    for (int chunk = 0; chunk < c.vpp; ++chunk) {
      for (int stage = 0; stage < c.pp; ++stage) {
        const Shapes s = StageShapes(spec, layers, stage);
        ASSERT_EQ(s.chunk_first_layer.size(), static_cast<size_t>(c.vpp)) << spec;
        for (int64_t j = 0; j < s.chunk_layers[chunk]; ++j) {
          EXPECT_EQ(s.GlobalLayer(chunk, j), next++) << spec << " stage " << stage;
        }
      }
    }
    EXPECT_EQ(next, layers) << spec;
  }
}

TEST(Fp8Linear, GradientsTakeTheGradientFormatAndWeightsTheForwardOne) {
  const Fp8Formats hybrid{Fp8Operand::kE4M3, Fp8Operand::kE5M2};
  device::GemmDesc d = Linear(64, 32, 16, 0, hybrid);
  EXPECT_EQ(d.fp8_a, Fp8Operand::kE4M3);  // x
  EXPECT_EQ(d.fp8_b, Fp8Operand::kE4M3);  // W
  d = LinearInputGrad(64, 32, 16, 0, hybrid);
  EXPECT_EQ(d.fp8_a, Fp8Operand::kE5M2);  // dy
  EXPECT_EQ(d.fp8_b, Fp8Operand::kE4M3);  // W
  d = LinearWeightGrad(64, 32, 16, hybrid);
  EXPECT_EQ(d.fp8_a, Fp8Operand::kE5M2);  // dy
  EXPECT_EQ(d.fp8_b, Fp8Operand::kE4M3);  // x
  d = Linear(64, 32, 16);
  EXPECT_EQ(d.fp8_a, Fp8Operand::kNone);
  EXPECT_EQ(d.fp8_b, Fp8Operand::kNone);
}

// TransformerEngine's linear layers: fast accumulation for the forward GEMM (_2X_ACC_FPROP =
// False), split accumulation for dgrad and wgrad (_2X_ACC_DGRAD = _2X_ACC_WGRAD = True).
TEST(Fp8Linear, OnlyTheForwardGemmAccumulatesFast) {
  for (const Fp8Formats fp8 : {Fp8Formats{Fp8Operand::kE4M3, Fp8Operand::kE5M2},
                               Fp8Formats{Fp8Operand::kE4M3, Fp8Operand::kE4M3}}) {
    EXPECT_TRUE(Linear(64, 32, 16, 0, fp8).fp8_fast_accumulate);
    EXPECT_FALSE(LinearInputGrad(64, 32, 16, 0, fp8).fp8_fast_accumulate);
    EXPECT_FALSE(LinearWeightGrad(64, 32, 16, fp8).fp8_fast_accumulate);
  }
  EXPECT_FALSE(Linear(64, 32, 16).fp8_fast_accumulate);  // not fp8: nothing to say
}

}  // namespace
}  // namespace autopar::trial
