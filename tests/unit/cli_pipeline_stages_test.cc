// Megatron-LM's ways of splitting the layers over pipeline stages, read into pp_first/pp_last/vpp
// (ApplyMegatronStages, docs/cli.md §2): uneven first/last stages, the embedding and loss counted
// as layers, a layout string; what Megatron-LM refuses, and what the model does not describe,
// refused naming the flag.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "autopar/cli/pipeline_stages.h"
#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "cli_test_util.h"

namespace autopar::cli {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The InputError's text, naming `flag`; "" (and a test failure) when nothing is thrown.
std::string Refusal(const MegatronStageFlags& f, const ModelSpec& model, ParallelConfig c,
                    const std::string& flag) {
  try {
    ApplyMegatronStages(f, model, c);
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), flag) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "not refused; want " << flag;
  return "";
}

ParallelConfig Pp(int32_t pp, int32_t vpp = 1) {
  ParallelConfig c;
  c.pp = pp;
  c.vpp = vpp;
  return c;
}

TEST(MegatronLayout, UnrollsAsMegatronLmParsesIt) {
  // megatron/core/transformer/pipeline_parallel_layer_layout.py's own example.
  std::vector<std::string> want = {"Ettt"};
  for (int i = 0; i < 29; ++i) want.push_back("tt");
  want.push_back("m");
  want.push_back("L");
  EXPECT_EQ(ParseMegatronLayout("Et*3|(tt|)*29,m|L"), want);
  // TransformerConfig's docstring example: empty-free stages, a repeated group then letters.
  EXPECT_EQ(ParseMegatronLayout("E|(tt|)*2,(t|)*4,mL"),
            (std::vector<std::string>{"E", "tt", "tt", "t", "t", "t", "t", "mL"}));
  // Multi-digit counts, `|` repeated as a letter, an empty stage, zero repeats.
  EXPECT_EQ(ParseMegatronLayout("Et*12|*2tL"),
            (std::vector<std::string>{"Ett" + std::string(10, 't'), "", "tL"}));
  EXPECT_EQ(ParseMegatronLayout("E(t|)*0L"), (std::vector<std::string>{"EL"}));
  for (const char* bad : {"Ex|L", "E T|L", "$LAYOUT"}) {
    try {
      ParseMegatronLayout(bad);
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "--pipeline-model-parallel-layout");
      EXPECT_TRUE(Has(e.what(), "E (embedding), t (transformer layer)")) << e.what();
    }
  }
  EXPECT_THROW(ParseMegatronLayout("Et*99999999999|L"), InputError);
  EXPECT_THROW(ParseMegatronLayout("E(tttt)*999999L"), InputError);
}

TEST(MegatronStages, FirstAndLastLayersAreTheUnevenStages) {
  const ModelSpec model = ModelPreset("llama3-8b");  // 32 layers
  MegatronStageFlags f;
  f.first_layers = 2;
  f.last_layers = 6;
  f.virtual_stages_flag = "--num-virtual-stages-per-pipeline-rank";
  ParallelConfig c = Pp(4, 2);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "--decoder-first-pipeline-num-layers");
  EXPECT_EQ(c.pp_first, 2);
  EXPECT_EQ(c.pp_last, 6);
  EXPECT_EQ(LargestStageLayers(c, 32), 12);
  // Canonical: a count equal to the middle stages' is dropped; pp=2 keeps the first.
  f = {};
  f.first_layers = 9;
  f.last_layers = 5;
  c = Pp(4);
  ApplyMegatronStages(f, model, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=4,pp_last=5")));
  f = {};
  f.last_layers = 16;
  c = Pp(2);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "");  // even after all
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=2")));
  f.last_layers = 17;
  ApplyMegatronStages(f, model, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=2,pp_first=15")));
  // One stage holds every layer: only its own count is accepted.
  f.last_layers = 32;
  c = Pp(1);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "");
  EXPECT_EQ(c, Pp(1));
}

TEST(MegatronStages, SplitsMegatronRefusesAreRefusedNamingTheFlag) {
  const ModelSpec model = ModelPreset("llama3-8b");
  MegatronStageFlags f;
  f.first_layers = 3;  // 29 left for 3 stages
  EXPECT_TRUE(Has(Refusal(f, model, Pp(4), "--decoder-first-pipeline-num-layers"), "do not split"));
  f.first_layers = 3;  // not a multiple of 2 virtual stages
  f.virtual_stages_flag = "--num-virtual-stages-per-pipeline-rank";
  EXPECT_TRUE(
      Has(Refusal(f, model, Pp(2, 2), "--decoder-first-pipeline-num-layers"), "multiple of vpp"));
  f = {};
  f.last_layers = 40;
  EXPECT_TRUE(Has(Refusal(f, model, Pp(4), "--decoder-last-pipeline-num-layers"), "32 layers"));
  f.last_layers = 8;
  EXPECT_TRUE(Has(Refusal(f, model, Pp(1), "--decoder-last-pipeline-num-layers"),
                  "--pipeline-model-parallel-size 1"));
  // Two ways of one thing (arguments.py's validate_args, TransformerConfig.__post_init__).
  f = {};
  f.first_layers = 8;
  f.layers_per_virtual_stage = 4;
  EXPECT_TRUE(Has(Refusal(f, model, Pp(4), "--num-layers-per-virtual-pipeline-stage"),
                  "--num-virtual-stages-per-pipeline-rank"));
  f.layers_per_virtual_stage = 0;
  f.account_for_loss = true;
  Refusal(f, model, Pp(4), "--account-for-loss-in-pipeline-split");
  f = {};
  f.layout = "Et*32L";
  f.account_for_embedding = true;
  Refusal(f, model, Pp(1), "--pipeline-model-parallel-layout");
  f = {};
  f.layers_per_virtual_stage = 4;
  f.virtual_stages_flag = "--num-virtual-stages-per-pipeline-rank";
  Refusal(f, model, Pp(4, 2), "--num-virtual-stages-per-pipeline-rank");
  f = {};
  f.layers_per_virtual_stage = 3;
  EXPECT_TRUE(Has(Refusal(f, model, Pp(4), "--num-layers-per-virtual-pipeline-stage"),
                  "must divide the 32 layers"));
}

TEST(MegatronStages, EmbeddingAndLossCountedAsLayersGiveTheFirstAndLastStages) {
  const ModelSpec model = ModelPreset("llama3-8b");
  MegatronStageFlags f;
  f.account_for_embedding = true;  // 33 over 3: the first stage builds 10, the others 11
  ParallelConfig c = Pp(3);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "--account-for-embedding-in-pipeline-split");
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=3,pp_first=10")));
  f = {};
  f.account_for_loss = true;
  c = Pp(3);
  ApplyMegatronStages(f, model, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=3,pp_last=10")));
  f.account_for_embedding = true;  // 34 over 2: 16 and 16, even
  c = Pp(2);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "");
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=2")));
  c = Pp(1);  // one stage: nothing to split
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "");
  // 34 layers do not split over 4 stages, as Megatron-LM asserts.
  EXPECT_TRUE(
      Has(Refusal(f, model, Pp(4), "--account-for-embedding-in-pipeline-split"), "34 in all"));
  // With virtual stages only the first chunk is short (31 layers and the embedding: 8 per stage,
  // 4 per virtual stage; the first chunk holds 3): split_embedding, placed chunk-major.
  ModelSpec odd = model;
  odd.num_layers = 31;
  f = {};
  f.account_for_embedding = true;
  c = Pp(4, 2);
  EXPECT_EQ(ApplyMegatronStages(f, odd, c), "--account-for-embedding-in-pipeline-split");
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=4,vpp=2,split_embedding=on")));
  EXPECT_EQ(StageLayers(c, 31, 0), 7);
  EXPECT_EQ(StageLayers(c, 31, 1), 8);
  EXPECT_EQ(ChunkLayers(c, 31, 0, 0), 3);
  EXPECT_EQ(ChunkLayers(c, 31, 0, 1), 4);
  EXPECT_EQ(ChunkFirstLayer(c, 31, 1, 0), 3);   // after the short first chunk
  EXPECT_EQ(ChunkFirstLayer(c, 31, 0, 1), 15);  // 3 + 4 + 4 + 4
  EXPECT_EQ(ChunkFirstLayer(c, 31, 3, 1), 27);  // the last chunk: layers 27-30
  // Qwen3-235B's recipe: 94 layers with both counted over pp 8 × vpp 4 (3 per virtual stage).
  ModelSpec qwen = model;
  qwen.num_layers = 94;
  f.account_for_loss = true;
  c = Pp(8, 4);
  ApplyMegatronStages(f, qwen, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=8,vpp=4,split_embedding=on,split_loss=on")));
  EXPECT_EQ(ChunkLayers(c, 94, 7, 3), 2);
  EXPECT_EQ(ChunkFirstLayer(c, 94, 7, 3), 92);
  // Chunks of one counted layer: the very first holds the embedding alone and the very last the
  // loss alone, as Megatron-core builds them (Llama 3 405B's 126 layers over pp 16 x vpp 8).
  ModelSpec llama = model;
  llama.num_layers = 126;
  c = Pp(16, 8);
  EXPECT_EQ(ApplyMegatronStages(f, llama, c), "--account-for-embedding-in-pipeline-split");
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=16,vpp=8,split_embedding=on,split_loss=on")));
  EXPECT_EQ(ChunkLayers(c, 126, 0, 0), 0);
  EXPECT_EQ(ChunkLayers(c, 126, 0, 1), 1);
  EXPECT_EQ(ChunkLayers(c, 126, 15, 7), 0);
  EXPECT_EQ(StageLayers(c, 126, 0), 7);
  EXPECT_EQ(StageLayers(c, 126, 7), 8);
  EXPECT_EQ(ChunkFirstLayer(c, 126, 1, 0), 0);     // the first layer, after the embedding's chunk
  EXPECT_EQ(ChunkFirstLayer(c, 126, 0, 1), 15);    // 15 chunks of one layer before it
  EXPECT_EQ(ChunkFirstLayer(c, 126, 14, 7), 125);  // the last layer, before the loss's chunk
  f.account_for_loss = false;
  c = Pp(4);
  ApplyMegatronStages(f, odd, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=4,pp_first=7")));
  // 7 layers and the embedding over 8 stages: the first one has no transformer layer.
  ModelSpec seven = model;
  seven.num_layers = 7;
  f = {};
  f.account_for_embedding = true;
  EXPECT_TRUE(Has(Refusal(f, seven, Pp(8), "--account-for-embedding-in-pipeline-split"),
                  "without transformer layers"));
}

TEST(MegatronStages, ALayoutOfFirstLastAndEvenStagesIsRead) {
  const ModelSpec model = ModelPreset("llama3-8b");
  MegatronStageFlags f;
  // pp=4 x 2 virtual stages, virtual stage-major: 1+1 | 6+6 | 6+6 | 3+3 layers per rank.
  f.layout = "Et|t*6|t*6|t*3|t|t*6|t*6|t*3L";
  ParallelConfig c = Pp(4);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "--pipeline-model-parallel-layout");
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=4,pp_first=2,pp_last=6,vpp=2")));
  // Even, with commas and a repeated group.
  f.layout = "Et*8,|(t*8|)*2,t*8L";
  c = Pp(4);
  EXPECT_EQ(ApplyMegatronStages(f, model, c), "");
  EXPECT_EQ(c, Pp(4));
  // DeepSeek-V3's 61 layers with its MTP layer on the last stage.
  ModelSpec deepseek = ModelPreset("deepseek-v3");
  deepseek.mtp_num_layers = 1;
  f.layout = "Et*3|(t*4|)*14,t*2mL";
  c = Pp(16);
  ApplyMegatronStages(f, deepseek, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=16,pp_first=3,pp_last=2")));
  // The embedding and the loss counted in the split, as a layout (--account-for-* with virtual
  // stages): Qwen3-235B's 94 layers over pp 8 × vpp 4, chunks of 3 but the first and the last of
  // 2; Llama 3 405B's 126 over pp 16 × vpp 8, the embedding and the loss a model chunk each.
  struct Counted {
    int64_t layers;
    const char* layout;
    int pp;
    const char* spec;
  };
  for (const Counted& k : {Counted{94, "Ett|(ttt|)*30,ttL", 8, "pp=8,vpp=4"},
                           Counted{126, "E|(t|)*126,L", 16, "pp=16,vpp=8"}}) {
    ModelSpec counted = model;
    counted.num_layers = k.layers;
    f.layout = k.layout;
    c = Pp(k.pp);
    EXPECT_EQ(ApplyMegatronStages(f, counted, c), "--pipeline-model-parallel-layout") << k.layout;
    EXPECT_EQ(ToSpec(c),
              ToSpec(ParseSpec(std::string(k.spec) + ",split_embedding=on,split_loss=on")));
  }
  ModelSpec qwen = model;
  qwen.num_layers = 95;  // only the first chunk short: the embedding counted alone
  f.layout = "Ett|(ttt|)*30,tttL";
  c = Pp(8);
  ApplyMegatronStages(f, qwen, c);
  EXPECT_EQ(ToSpec(c), ToSpec(ParseSpec("pp=8,vpp=4,split_embedding=on")));
}

TEST(MegatronStages, LayoutsTheModelDoesNotDescribeAreRefused) {
  const ModelSpec model = ModelPreset("llama3-8b");
  const std::string flag = "--pipeline-model-parallel-layout";
  auto refusal = [&](const std::string& layout, int32_t pp, const ModelSpec& m) {
    MegatronStageFlags f;
    f.layout = layout;
    return Refusal(f, m, Pp(pp), flag);
  };
  EXPECT_TRUE(Has(refusal("Et*8|t*7|t*9|t*8L", 4, model), "ranks 1 and 2 hold 7 and 9"));
  EXPECT_TRUE(Has(refusal("Et*8|t*12|t*12|L", 4, model), "rank 3 holds no transformer layer"));
  EXPECT_TRUE(Has(refusal("Et*4|t*8|t*12|t*8L", 2, model),
                  "model chunks of pipeline rank 0 hold 4 and 12"));
  EXPECT_TRUE(Has(refusal("|Et*16|t*16L", 3, model), "embedding is not on the first stage"));
  EXPECT_TRUE(Has(refusal("Et*16|t*16L|", 2, model), "do not divide"));
  EXPECT_TRUE(Has(refusal("Et*16|t*16L", 1, model), "need pp > 1"));
  // Megatron-LM's own rules: every layer once, E first, L last, MTP after the decoder.
  EXPECT_TRUE(Has(refusal("Et*30L", 1, model), "30 transformer layers"));
  EXPECT_TRUE(Has(refusal("tEt*31L", 1, model), "embedding E once, first"));
  EXPECT_TRUE(Has(refusal("Et*32", 1, model), "loss L once, last"));
  ModelSpec deepseek = ModelPreset("deepseek-v3");
  deepseek.mtp_num_layers = 1;
  EXPECT_TRUE(Has(refusal("Et*61L", 1, deepseek), "(--mtp-num-layers)"));
  EXPECT_TRUE(Has(refusal("Et*60mtL", 1, deepseek), "before the MTP layers"));
  // Its recipe's layout: a standalone MTP stage and a loss-only stage.
  EXPECT_TRUE(Has(refusal("Et*3|(tt|)*29,m|L", 16, deepseek), "standalone MTP"));
}

// The flags read from a pasted script; refusals name the flag and exit 2.
TEST(MegatronStages, ScriptsWithTheirStagesPredictAsTheConfiguration) {
  auto predict = [](const std::string& flag, const std::string& value,
                    const std::string& layers = "32") {
    return RunCli({"predict", "--model", "llama3-8b", "--num-layers", layers, "--gpu", "h100",
                   "--nnodes", "4", "--global-batch-size", "64", "--seq-length", "1024", "--bf16",
                   flag, value, "--format", "csv"});
  };
  const Result config = predict("--config", "tp=8,pp=4,pp_first=2,pp_last=6,vpp=2");
  ASSERT_EQ(config.code, kExitOk) << config.err;
  for (const char* script :
       {"--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
        "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 "
        "--num-virtual-stages-per-pipeline-rank 2 --overlap-grad-reduce",
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --overlap-grad-reduce "
        "--pipeline-model-parallel-layout 'Et|t*6|t*6|t*3|t|t*6|t*6|t*3L'"}) {
    const Result r = predict("--megatron-args", script);
    ASSERT_EQ(r.code, kExitOk) << script << ": " << r.err;
    EXPECT_EQ(r.out, config.out) << script;
    EXPECT_FALSE(Has(r.err, "ignored")) << r.err;
  }
  // The embedding counted as a layer: 31 layers and it over 4 stages.
  const Result account = predict("--megatron-args",
                                 "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
                                 "--account-for-embedding-in-pipeline-split",
                                 "31");
  EXPECT_EQ(account.code, kExitOk) << account.err;
  EXPECT_FALSE(Has(account.err, "ignored")) << account.err;
  EXPECT_TRUE(Has(account.out, "tp=8,pp=4,pp_first=7,")) << account.out;
  const Result bad = predict("--megatron-args",
                             "--pipeline-model-parallel-size 4 "
                             "--decoder-last-pipeline-num-layers 3");
  EXPECT_EQ(bad.code, kExitBadInput);
  EXPECT_TRUE(Has(bad.err, "--decoder-last-pipeline-num-layers: Megatron-LM refuses")) << bad.err;
}

// A launch script's layout in a variable, its pp from --megatron-env.
TEST(MegatronStages, AScriptsLayoutExpandsFromItsVariables) {
  const std::string path = ::testing::TempDir() + "uneven_layout.sh";
  {
    std::ofstream script(path);
    script << "#!/bin/bash\n"
              "LAYOUT=\"Et|t*6|t*6|t*3|t|t*6|t*6|t*3L\"\n"
              "PIPE=(\n  --pipeline-model-parallel-size $PP\n"
              "  --pipeline-model-parallel-layout \"${LAYOUT}\"\n)\n"
              "torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \\\n"
              "  --tensor-model-parallel-size 8 ${PIPE[@]} --overlap-grad-reduce --bf16\n";
  }
  const Result r =
      RunCli({"predict", "--model", "llama3-8b", "--gpu", "h100", "--global-batch-size", "64",
              "--seq-length", "1024", "--megatron-args-file", path, "--megatron-env", "PP=4",
              "--format", "megatron"});
  std::remove(path.c_str());
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out,
            "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
            "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 6 "
            "--num-virtual-stages-per-pipeline-rank 2 --micro-batch-size 1 --global-batch-size 64 "
            "--overlap-grad-reduce\n");
}

// plan pins the space with Megatron flags on its command line; the split of the stages it
// chooses itself, and says so.
TEST(MegatronStages, PlanBalancesUnevenPinsItselfAndRanksAPastedUnevenScript) {
  const std::vector<std::string> base = {"plan", "--model",      "llama3-8b", "--gpu",
                                         "h100", "--nnodes",     "4",         "--global-batch-size",
                                         "64",   "--seq-length", "1024"};
  std::vector<std::string> pinned = base;
  for (const char* a :
       {"--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "5"}) {
    pinned.push_back(a);
  }
  const Result balanced = RunCli(pinned);
  EXPECT_EQ(balanced.code, kExitOk) << balanced.err;
  EXPECT_TRUE(Has(balanced.err, "note: --decoder-first-pipeline-num-layers is not pinned"))
      << balanced.err;
  EXPECT_TRUE(Has(balanced.out, ",pp=4,")) << balanced.out;
  std::vector<std::string> pasted = base;
  pasted.push_back("--megatron-args");
  pasted.push_back(
      "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 "
      "--decoder-first-pipeline-num-layers 5");
  const Result ranked = RunCli(pasted);
  EXPECT_EQ(ranked.code, kExitOk) << ranked.err;
  EXPECT_TRUE(Has(ranked.err, "the script's configuration tp=8,pp=4,pp_first=5,")) << ranked.err;
}

}  // namespace
}  // namespace autopar::cli

namespace autopar::cli {
namespace {

// A script written for a bigger cluster: its tp·pp does not divide this one. plan says why in a
// note and searches all the same (it used to stop with exit 2).
TEST(MegatronStages, PlanNotesAScriptForAnotherClusterSizeAndSearches) {
  const Result r = RunCli({"plan", "--model", "llama3-8b", "--gpu", "h100", "--nnodes", "1",
                           "--global-batch-size", "64", "--seq-length", "1024", "--megatron-args",
                           "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(Has(r.err, "the script's configuration")) << r.err;
  EXPECT_TRUE(Has(r.err, "is not valid here")) << r.err;
  EXPECT_TRUE(Has(r.err, "world size 8")) << r.err;
  EXPECT_TRUE(Has(r.out, "rank config")) << r.out;
}

}  // namespace
}  // namespace autopar::cli
