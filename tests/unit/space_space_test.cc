#include "autopar/space/space.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "space_test_util.h"

namespace autopar {
namespace {

using testing::SmallCluster;
using testing::SmallTrain;
using testing::TinyModel;

// ParseSpec refuses each of `bad`, naming `must_mention`.
void ExpectSpecsRefused(std::initializer_list<std::string> bad, const std::string& must_mention) {
  for (const std::string& text : bad) {
    try {
      ParseSpec(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(must_mention), std::string::npos) << e.what();
    }
  }
}

// A SPEC key printed only where set: `text` parses with `field` set and prints as `printed`,
// which parses back; the key's default spelt out (`with_default`) is the configuration without it
// (`without`); each of `bad` is refused, naming `must_mention`.
void ExpectKeyPrintedWhereSet(const std::string& text, bool ParallelConfig::*field,
                              const std::string& printed, const std::string& with_default,
                              const std::string& without, std::initializer_list<std::string> bad,
                              const std::string& must_mention) {
  const ParallelConfig c = ParseSpec(text);
  EXPECT_TRUE(c.*field) << text;
  EXPECT_EQ(ToSpec(c), printed);
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
  EXPECT_EQ(ParseSpec(with_default), ParseSpec(without));
  ExpectSpecsRefused(bad, must_mention);
}

TEST(Spec, PrintsEveryKeyAndParsesBack) {
  ParallelConfig c;
  c.tp = 8;
  c.pp = 4;
  c.dp = 2;
  c.vpp = 3;
  c.mbs = 2;
  c.sp = true;
  c.recompute = Recompute::kSelective;
  c.dist_opt = true;
  c.overlap_param_gather = true;  // the default wherever Megatron allows it
  EXPECT_EQ(ToSpec(c),
            "tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=3,mbs=2,sp=on,recompute=selective,dist_opt=on");
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
  c.recompute = Recompute::kFull;
  c.recompute_layers = 5;
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
}

TEST(Spec, OmittedKeysTakeDefaultsAndDpIsDerived) {
  const ParallelConfig c = Complete(ParseSpec("tp=2,pp=2"), 16);
  EXPECT_EQ(c.dp, 4);
  EXPECT_EQ(c.mbs, 1);
  EXPECT_FALSE(c.sp);
  EXPECT_EQ(c.recompute, Recompute::kNone);
}

TEST(Spec, OverlapKnobsDefaultOnWhereAllowedAndPrintOnlyWhenNot) {
  // Omitted: grad overlap on; gather overlap on exactly where Megatron allows it; fp32 reduce.
  const ParallelConfig plain = ParseSpec("dp=4");
  EXPECT_TRUE(plain.overlap_grad_reduce);
  EXPECT_FALSE(plain.overlap_param_gather);
  EXPECT_EQ(plain.grad_reduce_dtype, GradReduceDtype::kFP32);
  const ParallelConfig dist = ParseSpec("dp=4,dist_opt=on");
  EXPECT_TRUE(dist.overlap_grad_reduce);
  EXPECT_TRUE(dist.overlap_param_gather);
  EXPECT_EQ(ToSpec(dist).find("overlap"), std::string::npos);
  EXPECT_FALSE(ParseSpec("dp=4,dist_opt=on,overlap_grad_reduce=off").overlap_param_gather);

  for (const char* text :
       {"dp=4,dist_opt=on,overlap_param_gather=off", "dp=4,overlap_grad_reduce=off",
        "dp=4,dist_opt=on,overlap_grad_reduce=off,grad_reduce_dtype=bf16",
        "dp=4,grad_reduce_dtype=bf16"}) {
    const ParallelConfig c = ParseSpec(text);
    EXPECT_EQ(ParseSpec(ToSpec(c)), c) << text;
  }
  EXPECT_EQ(ToSpec(ParseSpec("dp=4,dist_opt=on,overlap_param_gather=off")),
            "tp=1,pp=1,dp=4,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,recompute=none,dist_opt=on,"
            "overlap_param_gather=off");
  EXPECT_EQ(ToSpec(ParseSpec("dp=4,overlap_grad_reduce=off,grad_reduce_dtype=bf16")),
            "tp=1,pp=1,dp=4,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,recompute=none,dist_opt=off,"
            "overlap_grad_reduce=off,grad_reduce_dtype=bf16");
  EXPECT_THROW(ParseSpec("grad_reduce_dtype=fp16"), InputError);
  EXPECT_THROW(ParseSpec("overlap_grad_reduce=maybe"), InputError);
}

TEST(Spec, BadTextNamesTheFlagAndTheAllowedValues) {
  for (const char* bad : {"tp=0", "tp=x", "foo=1", "tp", "sp=maybe", "recompute=some",
                          "recompute_layers=2"}) {
    try {
      ParseSpec(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "--config") << bad;
    }
  }
  try {
    ParseSpec("recompute=some");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("none|selective|full"), std::string::npos);
  }
  EXPECT_THROW(Complete(ParseSpec("tp=2,dp=3"), 16), InputError);
  EXPECT_THROW(Complete(ParseSpec("tp=3"), 16), InputError);
  // Issue 17: sizes whose product passes 2^64 wrapped to 0 (a division by zero) or to a product
  // that matched the world size; they saturate and are refused.
  EXPECT_THROW(Complete(ParseSpec("tp=65536,pp=65536,cp=65536,up=65536"), 8), InputError);
  EXPECT_THROW(Complete(ParseSpec("tp=65536,pp=65536,cp=65536,up=65536,dp=1"), 8), InputError);
  EXPECT_EQ(ParseSpec("tp=65536,pp=65536,cp=65536,up=65536").model_parallel_size(), INT64_MAX);
  EXPECT_EQ(ParseSpec("tp=2147483647,pp=2147483647,cp=4,dp=2147483647").world_size(), INT64_MAX);
  EXPECT_THROW(ParseSpec("tp=4294967296"), InputError);  // past int32: refused, not truncated
}

TEST(Spec, RecomputeModulesPrintInMegatronsNamesAndOnlyBesideSelective) {
  const ParallelConfig c = ParseSpec("dp=4,recompute=selective,recompute_modules=moe+layernorm");
  EXPECT_EQ(c.selective_modules(), kRecomputeLayernorm | kRecomputeMoe);
  EXPECT_TRUE(c.Recomputes(kRecomputeMoe));
  EXPECT_FALSE(c.Recomputes(kRecomputeCoreAttn));  // the attention core is kept
  EXPECT_EQ(ToSpec(c),
            "tp=1,pp=1,dp=4,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,recompute=selective,"
            "recompute_modules=layernorm+moe,dist_opt=off");
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
  // Megatron's default, core_attn alone, is the canonical 0 and is not printed.
  const ParallelConfig core = ParseSpec("recompute=selective,recompute_modules=core_attn");
  EXPECT_EQ(core, ParseSpec("recompute=selective"));
  EXPECT_EQ(core.selective_modules(), kRecomputeCoreAttn);
  EXPECT_EQ(ParseSpec("recompute=full").selective_modules(), 0);
  const std::string selective = "recompute=selective,recompute_modules=";
  ExpectSpecsRefused({"recompute_modules=moe", "recompute=full,recompute_modules=moe",
                      selective + "attention", selective, selective + "mla_up_proj"},
                     "recompute_modules");
  try {
    ParseSpec("recompute=selective,recompute_modules=attention");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("core_attn, layernorm, mlp, moe, moe_act, shared_experts"),
              std::string::npos)
        << e.what();
  }
}

// Megatron's --moe-token-dispatcher-type flex: printed after etp only where chosen.
TEST(Spec, FlexDispatcherPrintsBesideTheExpertSizesAndRefusesWhatMegatronDoesNotHave) {
  ExpectKeyPrintedWhereSet("tp=2,dp=2,ep=4,etp=1,dispatcher=flex", &ParallelConfig::flex_dispatcher,
                           "tp=2,pp=1,dp=2,cp=1,up=1,ep=4,etp=1,dispatcher=flex,vpp=1,mbs=1,"
                           "sp=off,recompute=none,dist_opt=off",
                           "ep=4,dispatcher=alltoall", "ep=4",
                           {"dispatcher=allgather", "dispatcher=deepep", "dispatcher="},
                           "key 'dispatcher' takes alltoall|flex");
}

TEST(Space, FlexDispatcherIsEveryCandidatesAndNeedsRanksToDispatchOver) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  const TrainSpec train = SmallTrain(64, 4096);
  SpaceOptions options;
  options.flex_dispatcher = true;
  const SearchSpace space(ModelPreset("mixtral-8x7b"), train, cluster, options);
  int64_t n = 0;
  space.ForEach([&](const ParallelConfig& c) {
    ++n;
    EXPECT_TRUE(c.flex_dispatcher) << ToSpec(c);
    EXPECT_GT(int64_t{c.expert_tp()} * c.ep, 1) << ToSpec(c);
    EXPECT_EQ(space.Check(c), "") << ToSpec(c);
  });
  EXPECT_GT(n, 0);
  EXPECT_LT(n, SearchSpace(ModelPreset("mixtral-8x7b"), train, cluster, {}).Count());
  EXPECT_NE(space.Check(Complete(ParseSpec("tp=1,pp=8,dispatcher=flex"), 8)).find("etp·ep > 1"),
            std::string::npos);
  EXPECT_EQ(space.Check(Complete(ParseSpec("tp=2,pp=4,etp=2,sp=on,dispatcher=flex"), 8)), "");
  const SearchSpace dense(ModelPreset("llama2-7b"), train, cluster, {});
  EXPECT_NE(dense.Check(Complete(ParseSpec("tp=2,pp=4,dispatcher=flex"), 8)).find("mixture"),
            std::string::npos);
  try {
    const SearchSpace refused(ModelPreset("llama2-7b"), train, cluster, options);
    ADD_FAILURE() << "flex accepted for a dense model: " << refused.Count() << " candidates";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-token-dispatcher-type"), std::string::npos)
        << e.what();
  }
  SpaceOptions fixed;
  ApplyFix("dispatcher=flex", fixed);
  EXPECT_TRUE(fixed.flex_dispatcher);
}

// Megatron's --cp-comm-type all_gather: printed after up only where chosen; only the ring's split
// takes it (Megatron's a2a+p2p is Ulysses with the ring's p2p).
TEST(Spec, CpAllgatherPrintsBesideTheSequenceSplitAndNeedsTheRingAlone) {
  ExpectKeyPrintedWhereSet("cp=4,dp=2,cp_comm=allgather", &ParallelConfig::cp_allgather,
                           "tp=1,pp=1,dp=2,cp=4,up=1,cp_comm=allgather,ep=1,vpp=1,mbs=1,sp=off,"
                           "recompute=none,dist_opt=off",
                           "cp=4,cp_comm=p2p", "cp=4",
                           {"cp=2,cp_comm=all_gather", "cp=2,cp_comm=a2a", "cp=2,cp_comm="},
                           "key 'cp_comm' takes p2p|allgather");
  const SearchSpace space(ModelPreset("llama2-7b"), SmallTrain(64, 32768), SmallCluster(1, 8), {});
  EXPECT_EQ(space.Check(Complete(ParseSpec("tp=2,cp=4,cp_comm=allgather"), 8)), "");
  for (const char* needs_the_ring :
       {"tp=2,dp=4,cp_comm=allgather", "cp=2,up=2,cp_comm=allgather"}) {
    EXPECT_NE(space.Check(Complete(ParseSpec(needs_the_ring), 8)).find("needs cp > 1 and up = 1"),
              std::string::npos)
        << needs_the_ring;
  }
}

// Megatron's --fp8-param-gather: printed last where on, only with the distributed optimizer and
// FP8 training; never searched, and pinned on it holds in every candidate (each with dist_opt).
TEST(Spec, Fp8ParamGatherNeedsTheDistributedOptimizerAndFp8) {
  ExpectKeyPrintedWhereSet("tp=2,dp=4,dist_opt=on,fp8_param_gather=on",
                           &ParallelConfig::fp8_param_gather,
                           "tp=2,pp=1,dp=4,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,recompute=none,"
                           "dist_opt=on,fp8_param_gather=on",
                           "dist_opt=on,fp8_param_gather=off", "dist_opt=on",
                           {"dist_opt=on,fp8_param_gather=yes"}, "fp8_param_gather");
  const ParallelConfig c = ParseSpec("tp=2,dp=4,dist_opt=on,fp8_param_gather=on");

  TrainSpec fp8 = SmallTrain(64, 4096);
  fp8.precision = Precision::kFP8;
  const ClusterSpec cluster = SmallCluster(1, 8);
  const SearchSpace bf16_space(ModelPreset("llama2-7b"), SmallTrain(64, 4096), cluster, {});
  EXPECT_NE(bf16_space.Check(Complete(c, 8)).find("needs FP8 training"), std::string::npos);
  const SearchSpace fp8_space(ModelPreset("llama2-7b"), fp8, cluster, {});
  EXPECT_EQ(fp8_space.Check(Complete(c, 8)), "");
  EXPECT_NE(fp8_space.Check(Complete(ParseSpec("tp=2,dp=4,fp8_param_gather=on"), 8))
                .find("fp8_param_gather=on needs dist_opt=on"),
            std::string::npos);

  int64_t candidates = 0;
  fp8_space.ForEach([&](const ParallelConfig& x) {
    EXPECT_FALSE(x.fp8_param_gather) << ToSpec(x);
    ++candidates;
  });
  SpaceOptions pinned;
  ApplyFix("fp8_param_gather=on", pinned);
  int64_t with_fp8_params = 0, one_replica = 0;
  SearchSpace(ModelPreset("llama2-7b"), fp8, cluster, pinned).ForEach([&](const ParallelConfig& x) {
    EXPECT_TRUE(x.fp8_param_gather && x.dist_opt) << ToSpec(x);
    ++with_fp8_params;
    // One replica keeps the distributed optimizer here: Megatron runs it, FP8 parameters need it.
    if (int64_t{x.dp} * x.cp * x.up == 1) ++one_replica;
  });
  EXPECT_GT(one_replica, 0);
  EXPECT_LT(with_fp8_params, candidates);  // no dist_opt=off
  // Pinned on where it cannot be: the flag and why.
  for (const auto& [train, fix, why] :
       {std::tuple{SmallTrain(64, 4096), "fp8_param_gather=on", "needs FP8 training"},
        std::tuple{fp8, "fp8_param_gather=on,dist_opt=off", "needs dist_opt=on"}}) {
    SpaceOptions o;
    ApplyFix(fix, o);
    try {
      const SearchSpace refused(ModelPreset("llama2-7b"), train, cluster, o);
      ADD_FAILURE() << fix << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "--fix");
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// Both forms of the ring are searched wherever the ring runs alone; --fix pins one.
TEST(Space, EveryRingIsSearchedBothWaysUnlessFixed) {
  const ClusterSpec cluster = SmallCluster(1, 8);
  const TrainSpec train = SmallTrain(64, 32768);
  SpaceOptions options;
  options.cp = {2, 4};
  options.up = {1, 2};
  int64_t ring = 0, gathered = 0;
  const SearchSpace space(ModelPreset("llama2-7b"), train, cluster, options);
  space.ForEach([&](const ParallelConfig& c) {
    EXPECT_EQ(space.Check(c), "") << ToSpec(c);
    if (c.up > 1) {
      EXPECT_FALSE(c.cp_allgather) << ToSpec(c);
    } else {
      (c.cp_allgather ? gathered : ring) += 1;
    }
  });
  EXPECT_GT(ring, 0);
  EXPECT_EQ(gathered, ring);  // the same layouts, once each way
  SpaceOptions fixed = options;
  ApplyFix("cp_comm=p2p", fixed);
  SearchSpace(ModelPreset("llama2-7b"), train, cluster, fixed).ForEach([](const ParallelConfig& c) {
    EXPECT_FALSE(c.cp_allgather) << ToSpec(c);
  });
  ApplyFix("cp_comm=allgather", fixed);
  SearchSpace(ModelPreset("llama2-7b"), train, cluster, fixed).ForEach([](const ParallelConfig& c) {
    EXPECT_EQ(c.cp_allgather, c.up == 1) << ToSpec(c);
  });
}

TEST(Stages, UnevenSplitPrintsParsesAndFollowsMegatronsLayerOffsets) {
  // DeepSeek-V3's 61 layers over 16 stages: 1 on the first, 4 on each middle one, 0 given last.
  ParallelConfig c = ParseSpec("tp=2,pp=16,pp_first=1,pp_last=0,dp=1");
  EXPECT_EQ(ToSpec(c),
            "tp=2,pp=16,pp_first=1,dp=1,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=off,"
            "recompute=none,dist_opt=off");
  EXPECT_EQ(StageSplitError(c, 61), "");
  EXPECT_EQ(StageLayers(c, 61, 0), 1);
  for (int s = 1; s < 16; ++s) EXPECT_EQ(StageLayers(c, 61, s), 4) << s;
  EXPECT_EQ(ChunkFirstLayer(c, 61, 2, 0), 5);
  // Interleaved: 2 chunks per stage; 2 + 3·4 + 2 = 16 layers, chunk-major.
  c = ParseSpec("pp=5,pp_first=2,pp_last=2,vpp=2");
  EXPECT_EQ(StageSplitError(c, 16), "");
  EXPECT_EQ(ChunkFirstLayer(c, 16, 0, 0), 0);   // layer 0
  EXPECT_EQ(ChunkFirstLayer(c, 16, 1, 0), 1);   // layers 1-2
  EXPECT_EQ(ChunkFirstLayer(c, 16, 4, 0), 7);   // layer 7
  EXPECT_EQ(ChunkFirstLayer(c, 16, 0, 1), 8);   // layer 8
  EXPECT_EQ(ChunkFirstLayer(c, 16, 4, 1), 15);  // layer 15, the last
}

// Megatron's --account-for-embedding/loss-in-pipeline-split with virtual stages: the embedding
// and the loss count as layers of the even split of pp·vpp model chunks.
TEST(Stages, CountedSplitOfVirtualStagesPrintsAndRefusesWhatMegatronRefuses) {
  const ParallelConfig c = ParseSpec("pp=8,vpp=4,split_embedding=on,split_loss=on,dp=1");
  EXPECT_EQ(ToSpec(c),
            "tp=1,pp=8,dp=1,cp=1,up=1,ep=1,vpp=4,split_embedding=on,split_loss=on,mbs=1,sp=off,"
            "recompute=none,dist_opt=off");
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
  EXPECT_TRUE(UnevenStages(c));
  EXPECT_EQ(StageSplitError(c, 94), "");
  EXPECT_EQ(StageLayers(c, 94, 0), 11);
  EXPECT_EQ(StageLayers(c, 94, 3), 12);
  EXPECT_NE(StageSplitError(c, 95).find("do not split evenly"), std::string::npos);
  EXPECT_THROW(ParseSpec("pp=2,pp_first=3,split_embedding=on"), InputError);
  EXPECT_THROW(ParseSpec("split_loss=on"), InputError);  // one stage: nothing to split
  // Without virtual stages the canonical form is pp_first/pp_last.
  EXPECT_EQ(CanonicalStages(ParseSpec("pp=4,split_embedding=on"), 31),
            ParseSpec("pp=4,pp_first=7"));
  EXPECT_EQ(CanonicalStages(c, 94), c);
}

TEST(Stages, SplitsMegatronRefusesAreNamedAndTheCanonicalFormIsTheFewestGiven) {
  EXPECT_NE(StageSplitError(ParseSpec("pp=4,pp_first=3"), 16).find("do not split"),
            std::string::npos);  // 13 layers over 3 stages
  EXPECT_NE(StageSplitError(ParseSpec("pp=4,pp_first=3,vpp=2"), 15).find("multiple of vpp"),
            std::string::npos);
  EXPECT_NE(StageSplitError(ParseSpec("pp=2,pp_first=3,pp_last=3"), 8).find("leave 2"),
            std::string::npos);  // no middle stage may hold what is left
  EXPECT_NE(StageSplitError(ParseSpec("pp=3"), 8).find("does not divide"), std::string::npos);
  EXPECT_THROW(ParseSpec("pp=1,pp_first=2"), InputError);

  // 4, 4, 4, 4 given as first=4,last=4 is the even split; 3, 4, 4, 5 keeps both.
  EXPECT_EQ(CanonicalStages(ParseSpec("pp=4,pp_first=4,pp_last=4"), 16), ParseSpec("pp=4"));
  EXPECT_EQ(CanonicalStages(ParseSpec("pp=4,pp_first=3,pp_last=5"), 16),
            ParseSpec("pp=4,pp_first=3,pp_last=5"));
  EXPECT_EQ(CanonicalStages(ParseSpec("pp=4,pp_first=4,pp_last=1"), 13),
            ParseSpec("pp=4,pp_last=1"));
  EXPECT_EQ(CanonicalStages(ParseSpec("pp=2,pp_last=5"), 8), ParseSpec("pp=2,pp_first=3"));
}

TEST(SearchSpace, HandCountedTinySpace) {
  // 4 GPUs, 4 layers, 4 heads, gbs 8; no SP, recompute or distributed optimizer.
  // (tp,pp,dp): (1,1,4) mbs∈{1,2}: 2; (1,2,2) mbs∈{1,2,4} + vpp=2 for mbs∈{1,2}: 5;
  // (1,4,1) mbs∈{1,2,4,8}: 4; (2,1,2): 3; (2,2,1) 4 + vpp=2 for mbs∈{1,2,4}: 7; (4,1,1): 4.
  SpaceOptions o;
  o.sp = {false};
  o.recompute = {Recompute::kNone};
  o.dist_opt = {false};
  const SearchSpace space(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o);
  EXPECT_EQ(space.Count(), 25);

  o.sp = {};
  EXPECT_EQ(SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o).Count(), 25 + 14);
}

TEST(SearchSpace, EnumerationEqualsBruteForceFilteredByCheck) {
  ModelSpec m = TinyModel();
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 32;
  SpaceOptions o;
  o.cp = {1, 2};
  o.up = {1, 2};
  o.sweep_recompute_layers = true;
  const SearchSpace space(m, SmallTrain(8, 64), SmallCluster(2, 4), o);
  std::set<std::string> enumerated;
  space.ForEach([&](const ParallelConfig& c) {
    EXPECT_EQ(space.Check(c), "") << ToSpec(c);
    EXPECT_TRUE(enumerated.insert(ToSpec(c)).second) << "duplicate " << ToSpec(c);
  });
  std::set<std::string> brute;
  const int32_t degrees[] = {1, 2, 4, 8};
  for (int32_t tp : degrees)
    for (int32_t pp : degrees)
      for (int32_t dp : degrees)
        for (int32_t cp : {1, 2})
          for (int32_t up : {1, 2})
            for (int32_t ep : degrees)
              for (int32_t etp : {0, 1, 2, 4})  // 0 = tp; enumerated: the divisors of tp
              for (int32_t vpp : {1, 2, 4})
                for (int32_t mbs : {1, 2, 4, 8})
                  for (bool sp : {false, true})
                    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
                      for (int32_t layers : {0, 1, 2, 3})
                        for (bool dist_opt : {false, true})
                          for (bool allgather : {false, true}) {
                            ParallelConfig c{tp,  pp,  dp, cp, up,     ep,
                                             vpp, mbs, sp, r,  layers, dist_opt};
                            c.overlap_param_gather = OverlapParamGatherAllowed(c);  // the default
                            c.etp = etp;
                            c.cp_allgather = allgather;
                            if (etp != 0 && (etp >= tp || tp % etp != 0)) continue;
                            if (dist_opt && dp * cp * up == 1) continue;  // as dist_opt=off
                            if (space.Check(c).empty()) brute.insert(ToSpec(c));
                          }
  EXPECT_EQ(enumerated, brute);
  EXPECT_GT(brute.size(), 100u);
  // Folding lets etp = 1 reach ep that tp·cp·dp allows and cp·dp does not.
  EXPECT_TRUE(brute.count("tp=4,pp=1,dp=2,cp=1,up=1,ep=4,etp=1,vpp=1,mbs=1,sp=on,"
                          "recompute=none,dist_opt=off"));
  EXPECT_FALSE(brute.count("tp=4,pp=1,dp=2,cp=1,up=1,ep=4,vpp=1,mbs=1,sp=on,"
                           "recompute=none,dist_opt=off"));
}

ModelSpec TinyMoe() {
  ModelSpec m = TinyModel();
  m.num_experts = 8;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 32;
  return m;
}

TEST(Spec, EtpPrintsOnlyWhereItDiffersFromTpAndParsesBackCanonically) {
  ParallelConfig c = ParseSpec("tp=4,dp=2,ep=8,etp=1");
  EXPECT_EQ(c.etp, 1);
  EXPECT_EQ(c.expert_tp(), 1);
  EXPECT_EQ(ToSpec(c),
            "tp=4,pp=1,dp=2,cp=1,up=1,ep=8,etp=1,vpp=1,mbs=1,sp=off,recompute=none,dist_opt=off");
  EXPECT_EQ(ParseSpec(ToSpec(c)), c);
  EXPECT_EQ(c.expert_dp(), 1);  // 4·2 ranks per expert grid of 1·8
  // etp = tp is the default: one configuration, one text.
  EXPECT_EQ(ParseSpec("tp=4,dp=2,etp=4"), ParseSpec("tp=4,dp=2"));
  EXPECT_EQ(ParseSpec("tp=4,dp=2,etp=4").etp, 0);
  EXPECT_EQ(ParseSpec("tp=4,dp=2").expert_tp(), 4);
  EXPECT_EQ(ToSpec(ParseSpec("tp=4,dp=2,etp=4")).find("etp"), std::string::npos);
  EXPECT_THROW(ParseSpec("etp=0"), InputError);
}

TEST(SearchSpace, ExpertTensorParallelIsADimensionForMixtureOfExpertsOnly) {
  // Dense: experts follow tp, always.
  SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 8), {})
      .ForEach([](const ParallelConfig& c) { EXPECT_EQ(c.etp, 0) << ToSpec(c); });
  // MoE: every divisor of tp, each with the ep sizes its folding allows.
  std::set<std::pair<int32_t, int32_t>> tp_etp;
  int32_t widest_ep_at_etp1 = 0;
  const SearchSpace moe(TinyMoe(), SmallTrain(8, 64), SmallCluster(1, 8), {});
  moe.ForEach([&](const ParallelConfig& c) {
    tp_etp.insert({c.tp, c.expert_tp()});
    EXPECT_NE(c.etp, c.tp) << "etp = tp is spelled 0: " << ToSpec(c);
    EXPECT_EQ(int64_t{c.tp} * c.cp * c.dp % (int64_t{c.expert_tp()} * c.ep), 0) << ToSpec(c);
    if (c.tp == 4 && c.expert_tp() == 1) widest_ep_at_etp1 = std::max(widest_ep_at_etp1, c.ep);
  });
  EXPECT_EQ(tp_etp, (std::set<std::pair<int32_t, int32_t>>{
                        {1, 1}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {4, 4}}));
  EXPECT_EQ(widest_ep_at_etp1, 8);  // tp=4, dp=2: the 8 ranks, not dp·cp = 2
}

TEST(SearchSpace, ExpertTensorParallelFollowsMegatronsRules) {
  const SearchSpace space(TinyMoe(), SmallTrain(8, 64), SmallCluster(1, 8), {});
  auto check = [&](const char* spec) { return space.Check(Complete(ParseSpec(spec), 8)); };
  EXPECT_EQ(check("tp=4,dp=2,ep=8,etp=1,sp=on"), "");
  EXPECT_EQ(check("tp=1,dp=8,ep=4,etp=2"), "");  // etp > tp: Megatron allows it
  EXPECT_NE(check("tp=4,dp=2,ep=8,sp=on").find("etp·ep = 32 does not divide tp·cp·dp = 8"),
            std::string::npos);
  EXPECT_NE(check("tp=2,dp=4,ep=2,etp=3,sp=on").find("moe_ffn_hidden_size"), std::string::npos);
  EXPECT_NE(SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 8), {})
                .Check(Complete(ParseSpec("tp=2,dp=4,etp=1"), 8))
                .find("mixture-of-experts"),
            std::string::npos);
  // Megatron-core asserts etp = 1 for experts with biases.
  ModelSpec biased = TinyMoe();
  biased.add_bias_linear = true;
  const SearchSpace with_bias(biased, SmallTrain(8, 64), SmallCluster(1, 8), {});
  EXPECT_NE(with_bias.Check(Complete(ParseSpec("tp=2,dp=4,sp=on"), 8)).find("add_bias_linear"),
            std::string::npos);
  EXPECT_EQ(with_bias.Check(Complete(ParseSpec("tp=2,dp=4,etp=1,sp=on"), 8)), "");
  with_bias.ForEach([](const ParallelConfig& c) { EXPECT_EQ(c.expert_tp(), 1) << ToSpec(c); });
}

TEST(SearchSpace, EtpListAndFixRestrictIt) {
  SpaceOptions o;
  o.etp = {1};
  SearchSpace(TinyMoe(), SmallTrain(8, 64), SmallCluster(1, 8), o)
      .ForEach([](const ParallelConfig& c) { EXPECT_EQ(c.expert_tp(), 1) << ToSpec(c); });
  o = {};
  ApplyFix("etp=2,tp=1", o);
  EXPECT_EQ(o.etp, (std::vector<int32_t>{2}));
  int64_t n = 0;
  SearchSpace(TinyMoe(), SmallTrain(8, 64), SmallCluster(1, 8), o)
      .ForEach([&](const ParallelConfig& c) {
        EXPECT_EQ(c.expert_tp(), 2) << ToSpec(c);  // given explicitly, etp may exceed tp
        ++n;
      });
  EXPECT_GT(n, 0);
  // etp = tp pinned: the canonical 0.
  o = {};
  ApplyFix("etp=2,tp=2", o);
  SearchSpace(TinyMoe(), SmallTrain(8, 64), SmallCluster(1, 8), o)
      .ForEach([](const ParallelConfig& c) { EXPECT_EQ(c.etp, 0) << ToSpec(c); });
  EXPECT_THROW(ApplyFix("etp=0", o), InputError);
  EXPECT_THROW(ApplyFix("etp=x", o), InputError);
  auto field_of = [](const ModelSpec& m, std::vector<int32_t> etp) {
    SpaceOptions p;
    p.etp = std::move(etp);
    try {
      SearchSpace(m, SmallTrain(8, 64), SmallCluster(1, 8), p);
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(field_of(TinyModel(), {1}), "--etp");  // dense
  EXPECT_EQ(field_of(TinyMoe(), {3}), "--etp");    // 32 wide experts
  EXPECT_EQ(field_of(TinyMoe(), {1, 2}), "accepted");
}

TEST(SearchSpace, CheckNamesTheBrokenConstraint) {
  const SearchSpace space(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 8), {});
  EXPECT_NE(space.Check(Complete(ParseSpec("tp=8"), 8)).find("num_attention_heads"),
            std::string::npos);
  EXPECT_NE(space.Check(Complete(ParseSpec("pp=8"), 8)).find("num_layers"), std::string::npos);
  EXPECT_NE(space.Check(Complete(ParseSpec("tp=1,sp=on"), 8)).find("sp=on"), std::string::npos);
  EXPECT_NE(space.Check(Complete(ParseSpec("ep=2"), 8)).find("mixture-of-experts"),
            std::string::npos);
  EXPECT_EQ(space.Check(Complete(ParseSpec("tp=2,pp=2,sp=on"), 8)), "");
}

TEST(SearchSpace, ImpossibleRestrictionsNameTheFlag) {
  auto field_of = [](const SpaceOptions& o) {
    try {
      SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 8), o);
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  SpaceOptions o;
  o.tp = {3};
  EXPECT_EQ(field_of(o), "--tp");
  o = {};
  o.pp = {3};
  EXPECT_EQ(field_of(o), "--pp");
  o = {};
  o.ep = {2};
  EXPECT_EQ(field_of(o), "--ep");
  o = {};
  o.mbs = {3};
  EXPECT_EQ(field_of(o), "--micro-batch-size");
  o = {};
  o.cp = {3};
  EXPECT_EQ(field_of(o), "--cp");
  o = {};
  o.tp = {2};
  EXPECT_EQ(field_of(o), "accepted");
}

TEST(SearchSpace, FixPinsDimensions) {
  SpaceOptions o;
  ApplyFix("sp=on,tp=2,recompute=full,dist_opt=off", o);
  const SearchSpace space(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o);
  int64_t n = 0;
  space.ForEach([&](const ParallelConfig& c) {
    ++n;
    EXPECT_TRUE(c.sp);
    EXPECT_EQ(c.tp, 2);
    EXPECT_EQ(c.recompute, Recompute::kFull);
    EXPECT_FALSE(c.dist_opt);
  });
  EXPECT_EQ(n, 3 + 7);
  EXPECT_THROW(ApplyFix("sp=maybe", o), InputError);
  EXPECT_THROW(ApplyFix("tp", o), InputError);
  EXPECT_EQ(ParseIntList("--tp", "1,2,4"), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_THROW(ParseIntList("--tp", "1,,2"), InputError);
  EXPECT_THROW(ParseIntList("--tp", "a"), InputError);
}

TEST(SearchSpace, OverlapIsPinnedOnByDefaultAndFixable) {
  const SearchSpace open(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), {});
  int64_t n = 0;
  open.ForEach([&](const ParallelConfig& c) {
    ++n;
    EXPECT_TRUE(c.overlap_grad_reduce);
    EXPECT_EQ(c.overlap_param_gather, c.dist_opt);  // on wherever Megatron allows it
    EXPECT_EQ(c.grad_reduce_dtype, GradReduceDtype::kFP32);
    EXPECT_EQ(open.Check(c), "") << ToSpec(c);
  });
  // Not searched: the knobs do not multiply the space.
  SpaceOptions o;
  ApplyFix("overlap_grad_reduce=off,grad_reduce_dtype=bf16", o);
  const SearchSpace off(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o);
  EXPECT_EQ(off.Count(), n);
  off.ForEach([&](const ParallelConfig& c) {
    EXPECT_FALSE(c.overlap_grad_reduce);
    EXPECT_FALSE(c.overlap_param_gather);  // Megatron needs --overlap-grad-reduce for it
    EXPECT_EQ(c.grad_reduce_dtype, GradReduceDtype::kBF16);
  });
  o = {};
  ApplyFix("overlap_param_gather=off", o);
  SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o)
      .ForEach([](const ParallelConfig& c) {
        EXPECT_TRUE(c.overlap_grad_reduce);
        EXPECT_FALSE(c.overlap_param_gather);
      });
  // Both values, given programmatically, are both enumerated where they apply.
  o = {};
  o.dist_opt = {true};
  const int64_t distributed =
      SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o).Count();
  o.overlap_param_gather = {false, true};
  EXPECT_EQ(SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), o).Count(),
            2 * distributed);

  ParallelConfig bad = Complete(ParseSpec("dp=4,overlap_param_gather=on"), 4);
  EXPECT_NE(open.Check(bad).find("dist_opt=on"), std::string::npos);
  bad = Complete(ParseSpec("dp=4,dist_opt=on,overlap_grad_reduce=off,overlap_param_gather=on"), 4);
  EXPECT_NE(open.Check(bad).find("overlap_grad_reduce=on"), std::string::npos);
  auto refused = [](const char* fix) {
    SpaceOptions p;
    ApplyFix(fix, p);
    try {
      SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(1, 4), p);
    } catch (const InputError& e) {
      return e.field() == "--fix";
    }
    return false;
  };
  EXPECT_TRUE(refused("overlap_param_gather=on,dist_opt=off"));
  EXPECT_TRUE(refused("overlap_param_gather=on,overlap_grad_reduce=off"));
  EXPECT_FALSE(refused("overlap_param_gather=on"));
}

TEST(SearchSpace, TensorParallelStaysInsideANodeUnlessAllowed) {
  SpaceOptions o;
  const SearchSpace in_node(TinyModel(), SmallTrain(8, 64), SmallCluster(2, 2), o);
  in_node.ForEach([](const ParallelConfig& c) { EXPECT_LE(c.tp, 2); });
  o.tp_across_nodes = true;
  bool saw_tp4 = false;
  SearchSpace(TinyModel(), SmallTrain(8, 64), SmallCluster(2, 2), o)
      .ForEach([&](const ParallelConfig& c) { saw_tp4 |= c.tp == 4; });
  EXPECT_TRUE(saw_tp4);
}

// "TP within a node" is "TP within an NVLink domain": on GB200 NVL72 trays of 4 the domain is the
// rack's 72 GPUs, so tp = 8 spans two trays; 16 does not divide 72 and is refused.
TEST(SearchSpace, TensorParallelStaysInsideAnNvlinkDomain) {
  const ModelSpec llama = ModelPreset("llama2-70b");
  const TrainSpec train = SmallTrain(576, 4096);  // 72 GPUs leave a factor 9 to dp (or to pp)
  const auto tp_values = [&](const ClusterSpec& cluster) {
    std::set<int32_t> tps;
    SearchSpace(llama, train, cluster, SpaceOptions{}).ForEach([&](const ParallelConfig& c) {
      tps.insert(c.tp);
    });
    return tps;
  };
  const ClusterSpec rack{18, 4, GpuPreset("gb200")};
  EXPECT_EQ(tp_values(rack), (std::set<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(
      SearchSpace(llama, train, rack, SpaceOptions{}).Check(Complete(ParseSpec("tp=8,sp=on"), 72)),
      "");
  // Two racks: tp = 16 divides the world but not a rack, so some group would straddle two.
  const ClusterSpec racks{36, 4, GpuPreset("gb200")};
  const std::string why = SearchSpace(llama, train, racks, SpaceOptions{})
                              .Check(Complete(ParseSpec("tp=16,sp=on"), 144));
  EXPECT_NE(why.find("NVLink domain of 72 GPUs"), std::string::npos) << why;
  // Without the rack's NVLink switches the same trays keep tp inside one.
  ClusterSpec trays = rack;
  trays.gpu.nvlink_domain_gpus = 0;
  EXPECT_EQ(tp_values(trays), (std::set<int32_t>{1, 2, 4}));
  // HGX nodes of 8 H100s: tp = 16 leaves the node.
  const std::string h100_why = SearchSpace(llama, SmallTrain(512, 4096),
                                           ClusterSpec{4, 8, GpuPreset("h100")}, SpaceOptions{})
                                   .Check(Complete(ParseSpec("tp=16,sp=on"), 32));
  EXPECT_NE(h100_why.find("NVLink domain of 8 GPUs"), std::string::npos) << h100_why;
}

// Ulysses runs as Megatron's all-to-all context parallelism, whose Transformer Engine kernels
// scatter each tp rank's kv heads over the up ranks: up must divide them, never replicate them.
TEST(SearchSpace, UlyssesNeedsUpToDivideTheKvHeadsPerTpRank) {
  ModelSpec m = TinyModel();  // llama3-8b's head layout: 32 query heads, 8 kv heads
  m.hidden_size = 256;
  m.ffn_hidden_size = 512;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  const SearchSpace space(m, SmallTrain(16, 1024), SmallCluster(2, 8), {});
  auto check = [&](const char* spec) { return space.Check(Complete(ParseSpec(spec), 16)); };
  EXPECT_EQ(check("tp=4,up=2"), "");  // 2 kv heads per tp rank
  EXPECT_EQ(check("tp=2,up=4"), "");  // 4
  EXPECT_EQ(check("tp=8,up=1"), "");  // 1, no all-to-all
  for (const char* spec : {"tp=8,up=2", "tp=4,up=4", "tp=1,up=16"}) {
    const std::string reason = check(spec);
    EXPECT_NE(reason.find("key/value heads per tp rank"), std::string::npos) << spec << reason;
    EXPECT_NE(reason.find("--cp-comm-type a2a"), std::string::npos) << spec << reason;
  }
  // tp=8 with up=2 (query heads 32 % 16 == 0, but 1 kv head per tp rank) is never enumerated.
  SpaceOptions o;
  o.up = {2};
  int64_t n = 0;
  SearchSpace(m, SmallTrain(16, 1024), SmallCluster(2, 8), o).ForEach([&](const ParallelConfig& c) {
    EXPECT_LE(c.tp, 4) << ToSpec(c);
    ++n;
  });
  EXPECT_GT(n, 0);
  // With one kv head (MQA) no tp leaves up anything to scatter: --up 2 names the flag.
  m.num_query_groups = 1;
  try {
    static_cast<void>(SearchSpace(m, SmallTrain(16, 1024), SmallCluster(2, 8), o));
    ADD_FAILURE() << "--up 2 accepted with one kv head";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--up");
  }
  // MLA's keys and values carry one head per query head: only heads % (tp·up) matters.
  m.kv_lora_rank = 512;
  m.qk_head_dim = 128;
  m.qk_pos_emb_head_dim = 64;
  m.v_head_dim = 128;
  m.num_query_groups = 32;
  ASSERT_TRUE(m.is_mla());
  EXPECT_EQ(SearchSpace(m, SmallTrain(16, 1024), SmallCluster(2, 8), {})
                .Check(Complete(ParseSpec("tp=8,up=2"), 16)),
            "");
}

// Transformer Engine runs sliding-window attention with context parallelism only through the
// all-to-all: a windowed model never uses the ring.
TEST(SearchSpace, SlidingWindowSplitsTheSequenceByUlyssesOrTheGatheredRing) {
  ModelSpec m = TinyModel();
  m.window_size = 16;
  m.window_attn_skip_freq = 2;
  SpaceOptions o;
  o.cp = {1, 2};
  o.up = {1, 2};
  const SearchSpace space(m, SmallTrain(8, 64), SmallCluster(2, 4), o);
  bool ulysses = false, gathered = false;
  space.ForEach([&](const ParallelConfig& c) {
    EXPECT_TRUE(c.cp == 1 || (c.cp_allgather && c.up == 1)) << ToSpec(c);
    ulysses = ulysses || c.up == 2;
    gathered = gathered || c.cp_allgather;
  });
  EXPECT_TRUE(ulysses);
  EXPECT_TRUE(gathered);
  const std::string reason = space.Check(Complete(ParseSpec("tp=1,cp=2"), 8));
  EXPECT_NE(reason.find("sliding-window"), std::string::npos) << reason;
  EXPECT_EQ(space.Check(Complete(ParseSpec("tp=1,cp=2,cp_comm=allgather"), 8)), "");
  o.cp = {2};
  ApplyFix("cp_comm=p2p", o);
  try {
    static_cast<void>(SearchSpace(m, SmallTrain(8, 64), SmallCluster(2, 4), o));
    ADD_FAILURE() << "--cp 2 accepted for a sliding-window model's p2p ring";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--cp");
  }
  o.cp_allgather = {};
  // Without a window the ring is there.
  m.window_size = 0;
  m.window_attn_skip_freq = 0;
  o.cp = {1, 2};
  bool ring = false;
  SearchSpace(m, SmallTrain(8, 64), SmallCluster(2, 4), o).ForEach([&](const ParallelConfig& c) {
    ring = ring || (c.cp == 2 && !c.cp_allgather);
  });
  EXPECT_TRUE(ring);
}

}  // namespace
}  // namespace autopar
