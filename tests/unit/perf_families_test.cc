// The Hugging Face families of tests/data/spec/ against their published parameter counts, sliding-
// window attention costed as windowed (docs/models.md §4.2), and DeepSeek-V3's multi-token
// prediction counted in parameters, FLOPs, time and memory (§2).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/parse.h"
#include "space_test_util.h"

namespace autopar {
namespace {

using testing::SmallCluster;
using testing::SmallTrain;

ModelSpec FromFixture(const std::string& name) {
  const std::string path = std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return ModelFromHfConfig(text.str());
}

double Billions(int64_t n) { return static_cast<double>(n) / 1e9; }

// Within `percent` % of the published figure.
void ExpectWithin(double got, double published, double percent, const std::string& what) {
  EXPECT_NEAR(got, published, published * percent / 100) << what;
}

// Memory and time of the configuration `spec` on `gpus` GPUs for two variants of a model, 8
// sequences of 4096 tokens.
struct Compared {
  MemoryBreakdown memory_a, memory_b;
  TimeBreakdown time_a, time_b;
};
Compared Compare(const ModelSpec& a, const ModelSpec& b, int64_t gpus, const std::string& spec) {
  const ClusterSpec cluster = SmallCluster(1, gpus);
  const TrainSpec train = SmallTrain(8, 4096);
  const CostModel model_a(a, train, cluster, PerfConstants{});
  const CostModel model_b(b, train, cluster, PerfConstants{});
  const ParallelConfig c = Complete(ParseSpec(spec), gpus);
  return {model_a.Memory(c), model_b.Memory(c), model_a.Time(c), model_b.Time(c)};
}

TEST(FamilyParams, PublishedTotalsAndActive) {
  // Qwen3 reports activated parameters with the input embedding.
  const ParamCounts qwen30 = CountParams(FromFixture("qwen3-30b-a3b.config.json"));
  ExpectWithin(Billions(qwen30.total()), 30.5, 2, "Qwen3-30B-A3B total");
  ExpectWithin(Billions(qwen30.active() + qwen30.embedding), 3.3, 3, "Qwen3-30B-A3B active");
  const ParamCounts qwen235 = CountParams(FromFixture("qwen3-235b-a22b.config.json"));
  ExpectWithin(Billions(qwen235.total()), 235, 2, "Qwen3-235B-A22B total");
  ExpectWithin(Billions(qwen235.active() + qwen235.embedding), 22, 3, "Qwen3-235B-A22B active");
  // OpenAI's active counts take the unembedding but not the embedding, as active() does.
  const ParamCounts oss20 = CountParams(FromFixture("gpt-oss-20b.config.json"));
  ExpectWithin(Billions(oss20.total()), 20.91, 1, "gpt-oss-20b total");
  ExpectWithin(Billions(oss20.active()), 3.61, 2, "gpt-oss-20b active");
  const ParamCounts oss120 = CountParams(FromFixture("gpt-oss-120b.config.json"));
  ExpectWithin(Billions(oss120.total()), 116.83, 1, "gpt-oss-120b total");
  ExpectWithin(Billions(oss120.active()), 5.13, 2, "gpt-oss-120b active");
  // Dense models: tied (Gemma) and untied (Phi-3) embeddings.
  const ParamCounts gemma2 = CountParams(FromFixture("gemma-2-9b.config.json"));
  EXPECT_EQ(gemma2.output_layer, 0);
  ExpectWithin(Billions(gemma2.total()), 9.24, 1, "Gemma-2-9B total");
  ExpectWithin(Billions(CountParams(FromFixture("gemma-3-1b-it.config.json")).total()), 1.0, 1,
               "Gemma-3-1B total");
  ExpectWithin(Billions(CountParams(FromFixture("phi-3-mini-4k-instruct.config.json")).total()),
               3.82, 1, "Phi-3-mini total");
  ExpectWithin(Billions(CountParams(FromFixture("mistral-7b-v0.1.config.json")).total()), 7.24, 1,
               "Mistral-7B total");
}

TEST(FamilyParams, DeepseekMtpModuleIsCounted) {
  const ModelSpec hf = FromFixture("deepseek-v3.config.json");
  ASSERT_EQ(hf.mtp_num_layers, 1);
  ModelSpec main = hf;
  main.mtp_num_layers = 0;
  const ParamCounts with = CountParams(hf), without = CountParams(main);
  // One MoE layer, the 2h -> h projection and three RMSNorms; embedding and head are shared.
  const int64_t h = hf.hidden_size;
  EXPECT_EQ(with.mtp_extra_per_module, 2 * h * h + 3 * h);
  EXPECT_EQ(with.total() - without.total(),
            with.mtp_extra_per_module + with.moe_layer_non_expert() + with.expert_per_layer);
  // 685 B published = 671 B + a 14 B module whose checkpoint repeats embedding and head (1.85 B).
  ExpectWithin(Billions(with.total()), 685 - 1.85, 1, "DeepSeek-V3 with MTP");
  ExpectWithin(Billions(without.total()), 671, 0.5, "DeepSeek-V3 main model");
  // Active: the module's layer with top-8 experts, its projection and a second logits GEMM.
  const int64_t routed = with.expert_per_layer / with.num_experts * with.topk;
  EXPECT_EQ(with.active() - without.active(),
            with.mtp_extra_per_module + with.moe_layer_non_expert() + routed + with.output_layer);
  EXPECT_GT(ModelFlopsPerStep(hf, 8, 4096), ModelFlopsPerStep(main, 8, 4096));
}

// Megatron-core's --qk-layernorm (Qwen3): two norms over head_dim per layer, replicated; their
// input kept for the backward; their passes over q and k in the step time. MLA's latent norms
// (DeepSeek) are counted only with it, as Megatron-core builds them.
TEST(FamilyParams, QkLayernormIsCountedInParamsMemoryAndTime) {
  const ModelSpec qwen = FromFixture("qwen3-30b-a3b.config.json");
  ASSERT_TRUE(qwen.qk_layernorm);
  ModelSpec plain = qwen;
  plain.qk_layernorm = false;
  EXPECT_EQ(CountParams(qwen).total() - CountParams(plain).total(),
            qwen.num_layers * 2 * qwen.head_dim());  // RMSNorm: a weight each

  const ModelSpec deepseek = FromFixture("deepseek-v3.config.json");
  ModelSpec no_latent_norms = deepseek;
  no_latent_norms.qk_layernorm = false;
  EXPECT_EQ(CountParams(deepseek).total() - CountParams(no_latent_norms).total(),
            (deepseek.num_layers + deepseek.mtp_num_layers) *
                (deepseek.q_lora_rank + deepseek.kv_lora_rank));

  const Compared q = Compare(qwen, plain, 8, "tp=2,ep=4,pp=1");
  const MemoryBreakdown &mw = q.memory_a, &m0 = q.memory_b;
  // Per layer and micro-batch in flight: q and k of the rank's heads (bf16) and an f32 rstd per
  // head; the activations of one micro-batch at least.
  const double tokens = 4096, heads = (qwen.num_attention_heads + qwen.num_query_groups) / 2.0;
  const double per_layer = tokens * heads * (2.0 * qwen.head_dim() + 4);
  EXPECT_GE(mw.activations - m0.activations, 0.99 * qwen.num_layers * per_layer);
  const TimeBreakdown &tw = q.time_a, &t0 = q.time_b;
  EXPECT_GT(tw.features[kMemoryBound], t0.features[kMemoryBound]);
  EXPECT_LT(tw.step_time_s, 1.02 * t0.step_time_s);
}

// ---- sliding windows ----

TEST(SlidingWindow, CausalKeysPerQuery) {
  EXPECT_DOUBLE_EQ(CausalKeysPerQuery(32768, 0), 16384);
  EXPECT_DOUBLE_EQ(CausalKeysPerQuery(32768, 32768), 16384);
  EXPECT_DOUBLE_EQ(CausalKeysPerQuery(32768, 65536), 16384);
  // s·w − w²/2 key pairs over s queries.
  EXPECT_DOUBLE_EQ(CausalKeysPerQuery(32768, 4096), 4096 - 256);
  EXPECT_LT(CausalKeysPerQuery(32768, 4095), CausalKeysPerQuery(32768, 4096));
  EXPECT_NEAR(CausalKeysPerQuery(32768, 32767), 16384, 1e-3);  // continuous at w = s
}

// Named h100 for the flash kernels' shape law (AttentionShapeLawOf), the rest SmallCluster's.
ClusterSpec H100NamedNode() {
  ClusterSpec c = SmallCluster(1, 8);
  c.gpu.name = "h100";
  return c;
}

struct WindowCase : ::testing::Test {
  ClusterSpec cluster = H100NamedNode();
  TrainSpec train = SmallTrain(8, 32768);
  PerfConstants k;

  TimeBreakdown Time(const ModelSpec& m, const std::string& spec) const {
    const CostModel cm(m, train, cluster, k);
    return cm.Time(Complete(ParseSpec(spec), cluster.world_size()));
  }
};

TEST_F(WindowCase, MistralAt32kAttendsWithinItsWindow) {
  const ModelSpec windowed = FromFixture("mistral-7b-v0.1.config.json");
  ASSERT_EQ(windowed.window_size, 4096);
  ModelSpec full = windowed;
  full.window_size = 0;
  const AttentionShapeLaw law = AttentionShapeLawOf(cluster.gpu.name);
  const double d = windowed.head_dim();
  for (const char* spec : {"tp=8", "tp=4,cp=2", "tp=2,pp=4"}) {
    const TimeBreakdown w = Time(windowed, spec), f = Time(full, spec);
    EXPECT_LT(w.step_time_s, f.step_time_s) << spec;
    // Every layer windowed: the attention core does (4096 − 256) / 16384 of the causal work, in
    // kernel calls over 4096 keys, less efficient than the full layer's over 32768 (8192 per
    // ring step at cp = 2).
    const double keys = std::string(spec).find("cp=2") != std::string::npos ? 8192 : 32768;
    const double slower = AttentionShapeFactor(law, keys, d) / AttentionShapeFactor(law, 4096, d);
    EXPECT_GT(slower, 1) << spec;
    EXPECT_NEAR(w.features[kAttention] / f.features[kAttention], 3840.0 / 16384 * slower, 1e-9)
        << spec;
    EXPECT_DOUBLE_EQ(w.features[kGemm], f.features[kGemm]) << spec;
  }
  EXPECT_LT(ModelFlopsPerStep(windowed, 8, 32768), ModelFlopsPerStep(full, 8, 32768));
  // A window as long as the sequence is full attention.
  train.seq_length = 4096;
  EXPECT_DOUBLE_EQ(Time(windowed, "tp=8").step_time_s, Time(full, "tp=8").step_time_s);
}

TEST_F(WindowCase, UnfusedAttentionComputesTheWholeSquare) {
  k.stack.flash_attention = false;
  const ModelSpec windowed = FromFixture("mistral-7b-v0.1.config.json");
  ModelSpec full = windowed;
  full.window_size = 0;
  train.seq_length = 8192;
  EXPECT_DOUBLE_EQ(Time(windowed, "tp=8").step_time_s, Time(full, "tp=8").step_time_s);
}

TEST_F(WindowCase, GemmaPatternCountsOnlyTheGlobalLayersAsFull) {
  const ModelSpec gemma3 = FromFixture("gemma-3-1b-it.config.json");
  ASSERT_EQ(gemma3.window_attn_skip_freq, 6);
  ModelSpec full = gemma3;
  full.window_size = 0;
  full.window_attn_skip_freq = 0;
  const AttentionShapeLaw law = AttentionShapeLawOf(cluster.gpu.name);
  // A windowed layer's work, and its kernels' efficiency over `w` keys against 32768.
  auto windowed_share = [&](double w, double d) {
    return CausalKeysPerQuery(32768, w) / 16384 * AttentionShapeFactor(law, 32768, d) /
           AttentionShapeFactor(law, w, d);
  };
  const double share = windowed_share(512, gemma3.head_dim());
  // One stage: 4 global layers of 26 (6, 12, 18, 24 counted from 1).
  TimeBreakdown w = Time(gemma3, "tp=1,dp=8"), f = Time(full, "tp=1,dp=8");
  EXPECT_NEAR(w.features[kAttention] / f.features[kAttention], (4 + 22 * share) / 26, 1e-9);
  // The last of two stages holds layers 14..26: global ones 18 and 24.
  w = Time(gemma3, "tp=1,pp=2,dp=4");
  f = Time(full, "tp=1,pp=2,dp=4");
  EXPECT_NEAR(w.features[kAttention] / f.features[kAttention], (2 + 11 * share) / 13, 1e-9);

  // Gemma-2: every other layer global.
  const ModelSpec gemma2 = FromFixture("gemma-2-9b.config.json");
  ModelSpec full2 = gemma2;
  full2.window_size = 0;
  full2.window_attn_skip_freq = 0;
  const double share2 = windowed_share(4096, gemma2.head_dim());
  w = Time(gemma2, "tp=8");
  f = Time(full2, "tp=8");
  EXPECT_NEAR(w.features[kAttention] / f.features[kAttention], (21 + 21 * share2) / 42, 1e-9);
}

// ---- multi-token prediction in time and memory ----

TEST(MtpCost, LastStageRunsAndHoldsTheModule) {
  const ModelSpec hf = FromFixture("deepseek-v3.config.json");
  ModelSpec main = hf;
  main.mtp_num_layers = 0;
  const Compared mtp = Compare(hf, main, 1, "tp=1");
  const TimeBreakdown &tw = mtp.time_a, &t0 = mtp.time_b;
  EXPECT_GT(tw.features[kGemm], t0.features[kGemm]);
  EXPECT_GT(tw.features[kAttention], t0.features[kAttention]);
  EXPECT_GT(tw.features[kEpComm] + tw.features[kMemoryBound],
            t0.features[kEpComm] + t0.features[kMemoryBound]);
  // Weights: 2 bytes for each of the module's parameters; a second set of logits.
  const ParamCounts p = CountParams(hf);
  const MemoryBreakdown &mw = mtp.memory_a, &m0 = mtp.memory_b;
  EXPECT_NEAR(mw.weights - m0.weights, 2.0 * (p.mtp_non_expert() + p.mtp_experts()), 1.0);
  EXPECT_DOUBLE_EQ(mw.logits, 2 * m0.logits);
  EXPECT_GT(mw.activations, m0.activations);
}

}  // namespace
}  // namespace autopar
