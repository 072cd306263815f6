// The three ways to describe a model (Hugging Face config.json, model YAML, pasted Megatron-LM
// flags) agree with the presets, and bad input names the field or flag at fault.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "spec_test_util.h"

namespace autopar {
namespace {

// Every architecture field of ModelSpec, not the name.
::testing::AssertionResult SameArchitecture(const ModelSpec& got, const ModelSpec& want) {
  std::ostringstream diff;
  const auto check = [&](const char* field, auto a, auto b) {
    if (a != b) diff << "\n  " << field << ": got " << a << ", want " << b;
  };
  check("num_layers", got.num_layers, want.num_layers);
  check("hidden_size", got.hidden_size, want.hidden_size);
  check("ffn_hidden_size", got.ffn_hidden_size, want.ffn_hidden_size);
  check("num_attention_heads", got.num_attention_heads, want.num_attention_heads);
  check("num_query_groups", got.num_query_groups, want.num_query_groups);
  check("kv_channels", got.kv_channels, want.kv_channels);
  check("vocab_size", got.vocab_size, want.vocab_size);
  check("max_position_embeddings", got.max_position_embeddings, want.max_position_embeddings);
  check("activation", std::string(ToString(got.activation)), ToString(want.activation));
  check("norm", std::string(ToString(got.norm)), ToString(want.norm));
  check("position_embedding", std::string(ToString(got.position_embedding)),
        ToString(want.position_embedding));
  check("untie_embeddings", got.untie_embeddings, want.untie_embeddings);
  check("add_bias_linear", got.add_bias_linear, want.add_bias_linear);
  check("qk_layernorm", got.qk_layernorm, want.qk_layernorm);
  check("q_lora_rank", got.q_lora_rank, want.q_lora_rank);
  check("kv_lora_rank", got.kv_lora_rank, want.kv_lora_rank);
  check("qk_head_dim", got.qk_head_dim, want.qk_head_dim);
  check("qk_pos_emb_head_dim", got.qk_pos_emb_head_dim, want.qk_pos_emb_head_dim);
  check("v_head_dim", got.v_head_dim, want.v_head_dim);
  check("num_experts", got.num_experts, want.num_experts);
  check("moe_router_topk", got.moe_router_topk, want.moe_router_topk);
  check("moe_ffn_hidden_size", got.moe_ffn_hidden_size, want.moe_ffn_hidden_size);
  check("moe_shared_expert_intermediate_size", got.moe_shared_expert_intermediate_size,
        want.moe_shared_expert_intermediate_size);
  check("moe_first_dense_layers", got.moe_first_dense_layers, want.moe_first_dense_layers);
  check("window_size", got.window_size, want.window_size);
  check("window_attn_skip_freq", got.window_attn_skip_freq, want.window_attn_skip_freq);
  check("mtp_num_layers", got.mtp_num_layers, want.mtp_num_layers);
  if (diff.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "architectures differ:" << diff.str();
}

MegatronArgs FromFlags(const std::string& text, const ModelSpec& base = ModelSpec()) {
  return ApplyMegatronFlags(SplitCommandLine(text), base, TrainSpec());
}

std::string FlagError(const std::string& text, std::string* message = nullptr) {
  return ErrorField([&] { FromFlags(text); }, message);
}

bool Contains(const std::vector<std::string>& words, const std::string& word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

// ---- Hugging Face config.json ----

TEST(SpecHfConfig, ConfigsMatchPresets) {
  const ModelSpec llama7 = ModelFromHfConfig(ReadFixture("llama-2-7b-hf.config.json"));
  EXPECT_EQ(llama7.name, "meta-llama/Llama-2-7b-hf");
  EXPECT_TRUE(SameArchitecture(llama7, ModelPreset("llama2-7b")));
  EXPECT_TRUE(SameArchitecture(ModelFromHfConfig(ReadFixture("llama-2-70b-hf.config.json")),
                               ModelPreset("llama2-70b")));
  EXPECT_TRUE(SameArchitecture(ModelFromHfConfig(ReadFixture("mixtral-8x7b-v0.1.config.json")),
                               ModelPreset("mixtral-8x7b")));
  const ModelSpec deepseek = ModelFromHfConfig(ReadFixture("deepseek-v3.config.json"));
  EXPECT_EQ(deepseek.name, "deepseek_v3");  // no _name_or_path: falls back to model_type
  // The checkpoint's multi-token-prediction module (num_nextn_predict_layers) is counted; the
  // preset is the main model, as Megatron-LM trains it without --mtp-num-layers.
  ModelSpec deepseek_with_mtp = ModelPreset("deepseek-v3");
  deepseek_with_mtp.mtp_num_layers = 1;
  EXPECT_TRUE(SameArchitecture(deepseek, deepseek_with_mtp));
}

TEST(SpecHfConfig, Gpt2IsGptStyle) {
  const ModelSpec m = ModelFromHfConfig(ReadFixture("gpt2-xl.config.json"));
  ModelSpec want = ModelPreset("tiny-gpt");
  want.num_layers = 48;
  want.hidden_size = 1600;
  want.ffn_hidden_size = 6400;  // n_inner absent: 4 x n_embd
  want.num_attention_heads = 25;
  want.num_query_groups = 25;
  want.vocab_size = 50257;
  want.max_position_embeddings = 1024;
  EXPECT_TRUE(SameArchitecture(m, want));
}

TEST(SpecHfConfig, TabIndentedJsonParses) {
  std::string text = ReadFixture("llama-2-7b-hf.config.json");
  for (size_t pos = 0; (pos = text.find("\n  ", pos)) != std::string::npos;) {
    text.replace(pos, 3, "\n\t");
  }
  EXPECT_TRUE(SameArchitecture(ModelFromHfConfig(text), ModelPreset("llama2-7b")));
}

TEST(SpecHfConfig, HeadDimOnlyMattersWhenItDiffers) {
  const std::string qwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36,
      "hidden_size": 2560, "intermediate_size": 9728, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
      "max_position_embeddings": 40960, "tie_word_embeddings": true})";
  const ModelSpec m = ModelFromHfConfig(qwen3);
  EXPECT_EQ(m.kv_channels, 128);  // 2560 / 32 would be 80
  EXPECT_FALSE(m.untie_embeddings);
  EXPECT_EQ(m.name, "hf-model");
}

TEST(SpecHfConfig, BadInputNamesTheKey) {
  std::string text = ReadFixture("llama-2-70b-hf.config.json");
  const size_t layers = text.find("\"num_hidden_layers\": 80,");
  ASSERT_NE(layers, std::string::npos);
  std::string missing = text;
  missing.erase(layers, std::string("\"num_hidden_layers\": 80,").size());
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(missing); }), "num_hidden_layers");

  std::string wrong_type = text;
  wrong_type.replace(layers, std::string("\"num_hidden_layers\": 80").size(),
                     "\"num_hidden_layers\": \"eighty\"");
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(wrong_type); }), "num_hidden_layers");

  std::string message;
  EXPECT_EQ(ErrorField([] { ModelFromHfConfig(R"({"architectures": ["BertModel"]})"); }, &message),
            "architectures");
  EXPECT_NE(message.find("LlamaForCausalLM"), std::string::npos) << message;

  // Unterminated list on line 3.
  const std::string malformed = "{\n  \"architectures\": [\"LlamaForCausalLM\",\n  \"x\": 1\n}";
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(malformed); }, &message), "config.json");
  EXPECT_NE(message.find("line"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ModelFromHfConfig("[1, 2]"); }), "config.json");

  // Validation runs too: 64 heads do not split into 7 groups.
  std::string bad_groups = text;
  bad_groups.replace(bad_groups.find("\"num_key_value_heads\": 8"), 24,
                     "\"num_key_value_heads\": 7");
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(bad_groups); }), "num_query_groups");
}

// ---- model YAML ----

TEST(SpecModelYaml, BaseAndOverrides) {
  const ModelSpec m = ModelFromYaml(ReadFixture("custom-model.yaml"));
  EXPECT_EQ(m.name, "llama2-7b-gqa");
  ModelSpec want = ModelPreset("llama2-7b");
  want.num_query_groups = 8;
  want.max_position_embeddings = 8192;
  EXPECT_TRUE(SameArchitecture(m, want));
}

TEST(SpecModelYaml, FromScratchWithMegatronSpellings) {
  const ModelSpec m = ModelFromYaml(R"(
name: my-gpt
num_layers: 4
hidden_size: 64
ffn_hidden_size: 256
num_attention_heads: 4
vocab_size: 256
max_position_embeddings: 64
swiglu: false
normalization: LayerNorm
position_embedding_type: learned_absolute
untie_embeddings_and_output_weights: false
add_bias_linear: true
)");
  EXPECT_EQ(m.name, "my-gpt");
  EXPECT_EQ(m.num_query_groups, 4);  // defaults to the head count
  EXPECT_TRUE(SameArchitecture(m, ModelPreset("tiny-gpt")));

  const ModelSpec moe = ModelFromYaml(
      "base: tiny\nactivation: GELU\nnorm: layernorm\n"
      "num_experts: 4\nmoe_router_topk: 1\nmoe_ffn_hidden_size: 32\n"
      "disable_bias_linear: false\n");
  EXPECT_EQ(moe.activation, Activation::kGeLU);
  EXPECT_EQ(moe.norm, NormKind::kLayerNorm);
  EXPECT_TRUE(moe.add_bias_linear);
  EXPECT_EQ(moe.num_moe_layers(), 4);
}

TEST(SpecModelYaml, BadInputNamesTheKey) {
  std::string message;
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nnum_layer: 4\n"); }, &message), "num_layer");
  EXPECT_NE(message.find("num_layers"), std::string::npos) << message;  // lists known keys

  EXPECT_EQ(
      ErrorField([] { ModelFromYaml("base: tiny\nnum_layers: [4\nhidden_size: 8\n"); }, &message),
      "model YAML");
  EXPECT_NE(message.find("line"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ModelFromYaml("- tiny\n"); }), "model YAML");

  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: llama9\n"); }, &message), "base");
  EXPECT_NE(message.find("llama2-70b"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nactivation: relu\n"); }, &message),
            "activation");
  EXPECT_NE(message.find("swiglu|gelu"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nnormalization: BatchNorm\n"); }),
            "normalization");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nhidden_size: 0\n"); }), "hidden_size");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nnum_layers: -2\n"); }), "num_layers");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nnum_layers: four\n"); }), "num_layers");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nswiglu: maybe\n"); }), "swiglu");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: tiny\nnum_query_groups: 3\n"); }),
            "num_query_groups");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("num_layers: 2\n"); }), "hidden_size");
}

// ---- GPU and cluster YAML ----

TEST(SpecGpuYaml, HumanUnitsBecomeSi) {
  const GpuSpec g = GpuFromYaml(R"(
name: my-accelerator
memory_gb: 80
peak_tflops_bf16: 500
peak_tflops_fp32: 50
hbm_bandwidth_gbps: 2000
intra_node_bandwidth_gbps: 200
inter_node_bandwidth_gbps: 25
intra_node_latency_us: 2.5
inter_node_latency_us: 10
source: lab measurements, 2025
)");
  EXPECT_EQ(g.name, "my-accelerator");
  EXPECT_NEAR(g.memory_gib, 74.506, 1e-3);
  EXPECT_DOUBLE_EQ(g.peak_flops_bf16, 500e12);
  EXPECT_DOUBLE_EQ(g.peak_flops_fp16, 500e12);  // the one given stands for both
  EXPECT_DOUBLE_EQ(g.peak_flops_fp8, 0);
  EXPECT_DOUBLE_EQ(g.hbm_bandwidth, 2e12);
  EXPECT_DOUBLE_EQ(g.intra_node_bandwidth, 200e9);
  EXPECT_DOUBLE_EQ(g.inter_node_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(g.intra_node_latency_s, 2.5e-6);
  EXPECT_DOUBLE_EQ(g.inter_node_latency_s, 10e-6);
  EXPECT_EQ(g.source, "lab measurements, 2025");

  const GpuSpec capped = GpuFromYaml("base: H100\nmemory_gib: 70\n");
  EXPECT_EQ(capped.name, "h100");
  EXPECT_DOUBLE_EQ(capped.memory_gib, 70);
  EXPECT_DOUBLE_EQ(capped.peak_flops_fp8, 1979e12);
  EXPECT_NE(capped.source.find("user YAML over preset 'H100'"), std::string::npos);
}

TEST(SpecGpuYaml, BadInputNamesTheKey) {
  std::string message;
  // Without a base every figure is needed; the error names the YAML key, not the struct field.
  EXPECT_EQ(ErrorField([] { GpuFromYaml("memory_gib: 80\npeak_tflops_bf16: 500\n"); }, &message),
            "hbm_bandwidth_gbps");
  EXPECT_NE(message.find("h100"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: h100\nhbm_bandwidth: 3\n"); }, &message),
            "hbm_bandwidth");
  EXPECT_NE(message.find("hbm_bandwidth_gbps"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: h100\nmemory_gib: -1\n"); }), "memory_gib");
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: h100\nmemory_gib: lots\n"); }), "memory_gib");
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: tpu-v5\n"); }), "base");
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: h100\n  memory_gib: 1\n"); }), "GPU YAML");
}

TEST(SpecClusterYaml, NestedGpuOverPreset) {
  const ClusterSpec c = ClusterFromYaml(ReadFixture("cluster.yaml"));
  EXPECT_EQ(c.nnodes, 4);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.world_size(), 32);
  EXPECT_EQ(c.gpu.name, "h100-shared-nic");
  EXPECT_DOUBLE_EQ(c.gpu.inter_node_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(c.gpu.inter_node_latency_s, 10e-6);
  EXPECT_DOUBLE_EQ(c.gpu.intra_node_bandwidth, GpuPreset("h100").intra_node_bandwidth);
  EXPECT_NO_THROW(Validate(c));

  const ClusterSpec named = ClusterFromYaml("nnodes: 2\nnproc_per_node: 4\ngpu: a100-80gb\n");
  EXPECT_EQ(named.gpus_per_node, 4);
  EXPECT_EQ(named.gpu.name, "a100-80gb");
  // A partial file leaves the rest to flags; Validate then names what is still missing.
  const ClusterSpec partial = ClusterFromYaml("gpu: h200\n");
  EXPECT_EQ(ErrorField([&] { Validate(partial); }), "nnodes");
}

TEST(SpecClusterYaml, BadInputNamesTheKey) {
  std::string message;
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("nnodes: 2\ngpu: v100\n"); }, &message), "gpu");
  EXPECT_NE(message.find("b200"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("nnodes: 0\n"); }), "nnodes");
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("nodes: 2\n"); }), "nodes");
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("gpu: {base: h100, nvlink: 1}\n"); }), "gpu.nvlink");
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("nnodes: [2\n"); }), "cluster YAML");
}

TEST(SpecClusterYaml, NvlinkDomainInTheGpuMap) {
  // An NVL36x2 rack: the gb200 figures, 36 GPUs on each NVLink fabric.
  const ClusterSpec c =
      ClusterFromYaml("nnodes: 18\ngpus_per_node: 4\ngpu: {base: gb200, nvlink_domain_gpus: 36}\n");
  EXPECT_EQ(c.gpu.nvlink_domain_gpus, 36);
  EXPECT_EQ(c.NvlinkDomainGpus(), 36);
  EXPECT_NO_THROW(Validate(c));
  EXPECT_EQ(ClusterFromYaml("nnodes: 18\ngpus_per_node: 4\ngpu: gb300\n").NvlinkDomainGpus(), 72);
  EXPECT_EQ(GpuFromYaml("base: b200\nnvlink_domain_gpus: 16\n").nvlink_domain_gpus, 16);
  // Left out, it is the node.
  EXPECT_EQ(ClusterFromYaml("nnodes: 2\ngpus_per_node: 8\ngpu: h100\n").NvlinkDomainGpus(), 8);
}

TEST(SpecClusterYaml, BadNvlinkDomainNamesTheField) {
  std::string message;
  EXPECT_EQ(
      ErrorField([] { ClusterFromYaml("gpu: {base: gb200, nvlink_domain_gpus: 0}\n"); }, &message),
      "gpu.nvlink_domain_gpus");
  EXPECT_NE(message.find("positive"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("gpu: {base: gb200, nvlink_domain_gpus: -4}\n"); }),
            "gpu.nvlink_domain_gpus");
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("gpu: {base: gb200, nvlink_domain_gpus: 7.5}\n"); }),
            "gpu.nvlink_domain_gpus");
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("gpu: {base: gb200, nvlink_domain_gpus: all}\n"); }),
            "gpu.nvlink_domain_gpus");
  // Not whole nodes of the file's own size.
  EXPECT_EQ(ErrorField(
                [] {
                  ClusterFromYaml(
                      "gpus_per_node: 8\nnnodes: 9\ngpu: {base: gb200, nvlink_domain_gpus: 36}\n");
                },
                &message),
            "gpu.nvlink_domain_gpus");
  EXPECT_NE(message.find("not a multiple of gpus_per_node=8"), std::string::npos) << message;
  // The preset's 72 with 16 GPUs per node: the node size is what the file got wrong.
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("gpus_per_node: 16\ngpu: gb200\n"); }),
            "gpus_per_node");
  // The domain belongs to the GPU's system; at the top level the error says where it goes.
  EXPECT_EQ(ErrorField([] { ClusterFromYaml("nnodes: 18\nnvlink_domain_gpus: 72\n"); }, &message),
            "nvlink_domain_gpus");
  EXPECT_NE(message.find("gpu: {base: gb200"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([] { GpuFromYaml("base: h100\nnvlink_domain_gpus: 0\n"); }),
            "nvlink_domain_gpus");
}

// ---- Megatron-LM flags ----

TEST(SpecMegatronFlags, SplitCommandLineLikeAShell) {
  EXPECT_EQ(SplitCommandLine("  --a 1 \\\n  --b=2\t--c \"x y\" 'z w' # comment --d\n--e"),
            (std::vector<std::string>{"--a", "1", "--b=2", "--c", "x y", "z w", "--e"}));
  EXPECT_EQ(SplitCommandLine("ARGS=\"--num-layers 2 \\\n --swiglu\" torchrun"),
            (std::vector<std::string>{"ARGS=", "--num-layers", "2", "--swiglu", "torchrun"}));
  EXPECT_EQ(SplitCommandLine("--moe-layer-freq \"([0]*3+[1]*58)\" a\\ b"),
            (std::vector<std::string>{"--moe-layer-freq", "([0]*3+[1]*58)", "a b"}));
  EXPECT_EQ(ErrorField([] { SplitCommandLine("--name \"unterminated"); }), "megatron args");
}

TEST(SpecMegatronFlags, SplitCommandLineExpandsAScriptsVariablesAndArrays) {
  // Assignments are remembered; --megatron-env wins over them, and they over the environment.
  ShellVariables vars;
  vars.environment = {{"HIDDEN", "1024"}, {"LAYERS", "99"}, {"HOME", "/root"}};
  EXPECT_EQ(SplitCommandLine("LAYERS=32\n--num-layers $LAYERS --hidden-size ${HIDDEN} "
                             "--seq-length ${SEQ:-\"2048\"} --x ${UNSET} $1 ${HOME:-/tmp}",
                             vars),
            (std::vector<std::string>{"LAYERS=32", "--num-layers", "32", "--hidden-size", "1024",
                                      "--seq-length", "2048", "--x", "${UNSET}", "$1", "/root"}));
  vars.overrides = {{"LAYERS", "16"}};
  EXPECT_EQ(SplitCommandLine("LAYERS=32 --num-layers $LAYERS", vars),
            (std::vector<std::string>{"LAYERS=32", "--num-layers", "16"}));

  // Array items stand where they were written, split as the arrays' unquoted expansion would be;
  // `)` closes the array, `+=(` appends, comments inside are skipped.
  EXPECT_EQ(SplitCommandLine("TP=2\nDTYPE_ARGS=()\nDTYPE_ARGS+=(\n  \"--fp8-format hybrid\"\n"
                             "  # --pipeline-model-parallel-size 4\n  \"--split '99,1,0'\"\n)\n"
                             "PAR=(--tensor-model-parallel-size $TP --sequence-parallel)\n"
                             "TRAIN+=(\"${DDP[@]}\")\ntorchrun ${PAR[@]} \"$TP\"",
                             vars),
            (std::vector<std::string>{"TP=2", "DTYPE_ARGS=(", "DTYPE_ARGS+=(", "--fp8-format",
                                      "hybrid", "--split", "'99,1,0'", "PAR=(",
                                      "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                      "TRAIN+=(", "${DDP[@]}", "torchrun", "${PAR[@]}", "2"}));
  // An unquoted expansion splits into fields; a quoted one does not; "" is a word.
  vars.overrides = {{"ARGS", "--bf16 --fp16"}};
  EXPECT_EQ(SplitCommandLine("run $ARGS \"$ARGS\" \"\"", vars),
            (std::vector<std::string>{"run", "--bf16", "--fp16", "--bf16 --fp16", ""}));
}

TEST(SpecMegatronFlags, PretrainScriptsMatchPresets) {
  const MegatronArgs llama = FromFlags(ReadFixture("llama2-7b.megatron.sh"));
  EXPECT_TRUE(SameArchitecture(llama.model, ModelPreset("llama2-7b")));
  EXPECT_EQ(llama.train.global_batch_size, 1024);
  EXPECT_EQ(llama.train.seq_length, 4096);
  EXPECT_EQ(llama.train.precision, Precision::kBF16);
  for (const char* word : {"GPT_ARGS=", "--tensor-model-parallel-size", "--micro-batch-size",
                           "--lr", "3.0e-4", "--use-flash-attn"}) {
    EXPECT_TRUE(Contains(llama.unused, word)) << word;
  }
  EXPECT_FALSE(Contains(llama.unused, "--swiglu"));

  const MegatronArgs deepseek = FromFlags(ReadFixture("deepseek-v3.megatron.sh"));
  EXPECT_TRUE(SameArchitecture(deepseek.model, ModelPreset("deepseek-v3")));
  EXPECT_TRUE(Contains(deepseek.unused, "--moe-router-topk-scaling-factor"));

  const MegatronArgs mixtral = FromFlags(ReadFixture("mixtral-8x7b.megatron.sh"));
  EXPECT_TRUE(SameArchitecture(mixtral.model, ModelPreset("mixtral-8x7b")));
  EXPECT_EQ(mixtral.train.seq_length, 4096);
}

TEST(SpecMegatronFlags, FromScratchTakesMegatronDefaults) {
  // Megatron-LM's GPT-3 175B example gives only the shape: everything else is a default.
  const MegatronArgs gpt3 = FromFlags(
      "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
      "--max-position-embeddings 2048 --vocab-size 51200");
  EXPECT_TRUE(SameArchitecture(gpt3.model, ModelPreset("gpt3-175b")));

  // SwiGLU without --ffn-hidden-size: int(4h * 2/3 / 64) * 64, as Megatron computes it.
  const MegatronArgs swiglu = FromFlags(
      "--num-layers 2 --hidden-size=4096 --num-attention-heads=32 --swiglu --vocab-size 1000 "
      "--group-query-attention --seq-length 128");
  EXPECT_EQ(swiglu.model.ffn_hidden_size, 10880);
  EXPECT_EQ(swiglu.model.num_query_groups, 1);  // Megatron's default with GQA
  EXPECT_EQ(swiglu.model.max_position_embeddings, 128);

  const MegatronArgs moe = FromFlags(
      "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 "
      "--max-position-embeddings 64 --num-experts 4 --moe-layer-freq [0]*1+[1]*3");
  EXPECT_EQ(moe.model.moe_router_topk, 2);
  EXPECT_EQ(moe.model.moe_ffn_hidden_size, 256);
  EXPECT_EQ(moe.model.moe_first_dense_layers, 1);
}

TEST(SpecMegatronFlags, FlagsOverrideABase) {
  const MegatronArgs out = ApplyMegatronFlags({"--num-layers=40", "--seq-length", "8192", "--fp16"},
                                              ModelPreset("llama2-70b"), TrainSpec{256, 0, {}});
  ModelSpec want = ModelPreset("llama2-70b");
  want.num_layers = 40;
  EXPECT_TRUE(SameArchitecture(out.model, want));
  EXPECT_EQ(out.model.name, "llama2-70b");
  EXPECT_EQ(out.train.global_batch_size, 256);
  EXPECT_EQ(out.train.seq_length, 8192);
  EXPECT_EQ(out.train.precision, Precision::kFP16);

  // A base without GQA follows a new head count.
  const MegatronArgs heads =
      ApplyMegatronFlags({"--num-attention-heads", "16"}, ModelPreset("llama2-7b"), TrainSpec());
  EXPECT_EQ(heads.model.num_query_groups, 16);
}

TEST(SpecMegatronFlags, TrainFlagsAloneLeaveTheModelAlone) {
  const MegatronArgs out = ApplyMegatronFlags(
      {"--global-batch-size", "512", "--bf16", "--fp8-format", "hybrid"}, ModelSpec(), TrainSpec());
  EXPECT_EQ(out.model.num_layers, 0);
  EXPECT_EQ(out.train.global_batch_size, 512);
  EXPECT_EQ(out.train.precision, Precision::kFP8);
  EXPECT_TRUE(out.unused.empty());
}

TEST(SpecMegatronFlags, BadInputNamesTheFlag) {
  const std::string shape =
      "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 "
      "--max-position-embeddings 64 ";
  std::string message;
  EXPECT_EQ(FlagError("--num-layers abc"), "--num-layers");
  EXPECT_EQ(FlagError("--num-layers 12x"), "--num-layers");
  EXPECT_EQ(FlagError("--hidden-size 0"), "--hidden-size");
  EXPECT_EQ(FlagError("--hidden-size=-8"), "--hidden-size");
  EXPECT_EQ(FlagError("--global-batch-size ${GBS}"), "--global-batch-size");
  EXPECT_EQ(FlagError("--num-layers --swiglu"), "--num-layers");
  EXPECT_EQ(FlagError("--num-layers"), "--num-layers");
  EXPECT_EQ(FlagError("--swiglu=true"), "--swiglu");
  EXPECT_EQ(FlagError("--normalization BatchNorm", &message), "--normalization");
  EXPECT_NE(message.find("RMSNorm|LayerNorm"), std::string::npos) << message;
  EXPECT_EQ(FlagError("--position-embedding-type alibi", &message), "--position-embedding-type");
  EXPECT_NE(message.find("rope|learned_absolute"), std::string::npos) << message;
  EXPECT_EQ(FlagError("--fp8-format e5m2"), "--fp8-format");
  EXPECT_EQ(FlagError(shape + "--num-query-groups 3"), "--num-query-groups");
  EXPECT_EQ(FlagError("--num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                      "--tokenizer-type HuggingFaceTokenizer --max-position-embeddings 64",
                      &message),
            "--vocab-size");
  EXPECT_NE(message.find("GPT2BPETokenizer, Llama2Tokenizer"), std::string::npos) << message;
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-router-topk 9"), "--moe-router-topk");
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-layer-freq [0]*3+[1]*2"), "--moe-layer-freq");
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-layer-freq [0]*4"), "--moe-layer-freq");
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-layer-freq 2"), "--moe-layer-freq");
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-layer-freq [1,0,1,1]"), "--moe-layer-freq");
  EXPECT_EQ(FlagError(shape + "--num-experts 8 --moe-layer-freq [0]*1+[2]*3"), "--moe-layer-freq");
  EXPECT_EQ(FlagError(shape), "");
}

}  // namespace
}  // namespace autopar
