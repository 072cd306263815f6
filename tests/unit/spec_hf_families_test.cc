// Hugging Face families beyond Llama (Qwen3-MoE, gpt-oss, Gemma-2/3, Phi-3, Mistral's window),
// sliding-window attention in every spelling (config.json, YAML, Megatron-LM flags), DeepSeek's
// multi-token prediction, and MoE-looking keys that no reader understands. The fixtures under
// tests/data/spec/ carry the published config.json fields of each model.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "spec_test_util.h"

namespace autopar {
namespace {

// `text` with the first occurrence of `from` replaced by `to` (which must be there).
std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// ---- the families ----

TEST(SpecHfFamilies, Qwen3MoeHasRoutedExpertsOnEveryLayer) {
  const ModelSpec m = ModelFromHfConfig(ReadFixture("qwen3-30b-a3b.config.json"));
  EXPECT_EQ(m.name, "qwen3_moe");
  EXPECT_EQ(m.num_layers, 48);
  EXPECT_EQ(m.hidden_size, 2048);
  EXPECT_EQ(m.num_attention_heads, 32);
  EXPECT_EQ(m.num_query_groups, 4);
  EXPECT_EQ(m.kv_channels, 128);  // 2048 / 32 would be 64
  EXPECT_EQ(m.vocab_size, 151936);
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.moe_router_topk, 8);
  EXPECT_EQ(m.moe_ffn_hidden_size, 768);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 0);
  EXPECT_EQ(m.moe_first_dense_layers, 0);
  EXPECT_EQ(m.num_moe_layers(), 48);
  EXPECT_TRUE(m.untie_embeddings);
  EXPECT_EQ(m.window_size, 0);  // sliding_window null, use_sliding_window false

  const ModelSpec big = ModelFromHfConfig(ReadFixture("qwen3-235b-a22b.config.json"));
  EXPECT_EQ(big.num_layers, 94);
  EXPECT_EQ(big.hidden_size, 4096);
  EXPECT_EQ(big.num_attention_heads, 64);
  EXPECT_EQ(big.num_query_groups, 4);
  EXPECT_EQ(big.kv_channels, 128);
  EXPECT_EQ(big.moe_ffn_hidden_size, 1536);
  EXPECT_EQ(big.num_experts, 128);
}

TEST(SpecHfFamilies, Qwen3MoeDenseLayersMustLead) {
  const std::string text = ReadFixture("qwen3-30b-a3b.config.json");
  const ModelSpec leading =
      ModelFromHfConfig(Replace(text, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [0, 1]"));
  EXPECT_EQ(leading.moe_first_dense_layers, 2);
  EXPECT_EQ(leading.ffn_hidden_size, 6144);  // intermediate_size: the dense layers' MLP
  EXPECT_EQ(
      ErrorField([&] {
        ModelFromHfConfig(Replace(text, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [3]"));
      }),
      "mlp_only_layers");
  EXPECT_EQ(ErrorField([&] {
              ModelFromHfConfig(
                  Replace(text, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"));
            }),
            "decoder_sparse_step");
}

TEST(SpecHfFamilies, GptOssAlternatesWindowedAndFullLayers) {
  const ModelSpec m = ModelFromHfConfig(ReadFixture("gpt-oss-20b.config.json"));
  EXPECT_EQ(m.num_layers, 24);
  EXPECT_EQ(m.hidden_size, 2880);
  EXPECT_EQ(m.num_attention_heads, 64);
  EXPECT_EQ(m.num_query_groups, 8);
  EXPECT_EQ(m.kv_channels, 64);  // 2880 / 64 = 45
  EXPECT_EQ(m.vocab_size, 201088);
  EXPECT_EQ(m.num_experts, 32);
  EXPECT_EQ(m.moe_router_topk, 4);
  EXPECT_EQ(m.moe_ffn_hidden_size, 2880);
  EXPECT_TRUE(m.add_bias_linear);  // attention and expert biases
  EXPECT_TRUE(m.untie_embeddings);
  EXPECT_EQ(m.window_size, 128);
  EXPECT_EQ(m.window_attn_skip_freq, 2);  // layer_types: sliding, full, sliding, ...
  EXPECT_TRUE(m.is_windowed_layer(0));
  EXPECT_FALSE(m.is_windowed_layer(1));

  const ModelSpec big = ModelFromHfConfig(ReadFixture("gpt-oss-120b.config.json"));
  EXPECT_EQ(big.num_layers, 36);
  EXPECT_EQ(big.num_experts, 128);
  EXPECT_EQ(big.window_attn_skip_freq, 2);

  // Without layer_types (configs written before transformers 4.53) the pattern is the family's.
  std::string text = ReadFixture("gpt-oss-20b.config.json");
  const size_t from = text.find("\"layer_types\"");
  const size_t to = text.find("],", from) + 2;
  text.erase(from, to - from);
  EXPECT_EQ(ModelFromHfConfig(text).window_attn_skip_freq, 2);
  // Either spelling of the top-k; disagreeing ones are refused.
  const ModelSpec old_key = ModelFromHfConfig(Replace(text, "\"num_experts_per_tok\": 4,", ""));
  EXPECT_EQ(old_key.moe_router_topk, 4);
  EXPECT_EQ(
      ErrorField([&] {
        ModelFromHfConfig(Replace(text, "\"experts_per_token\": 4", "\"experts_per_token\": 2"));
      }),
      "experts_per_token");
}

TEST(SpecHfFamilies, GemmaHasGlobalLayersBetweenLocalOnes) {
  const ModelSpec g2 = ModelFromHfConfig(ReadFixture("gemma-2-9b.config.json"));
  EXPECT_EQ(g2.num_layers, 42);
  EXPECT_EQ(g2.hidden_size, 3584);
  EXPECT_EQ(g2.ffn_hidden_size, 14336);
  EXPECT_EQ(g2.num_attention_heads, 16);
  EXPECT_EQ(g2.num_query_groups, 8);
  EXPECT_EQ(g2.kv_channels, 256);  // 3584 / 16 would be 224
  EXPECT_EQ(g2.vocab_size, 256000);
  EXPECT_FALSE(g2.untie_embeddings);              // Gemma ties by default
  EXPECT_EQ(g2.activation, Activation::kSwiGLU);  // GeGLU: a gated MLP
  EXPECT_EQ(g2.window_size, 4096);
  EXPECT_EQ(g2.window_attn_skip_freq, 2);
  EXPECT_EQ(g2.num_windowed_layers(0, 42), 21);

  const ModelSpec g3 = ModelFromHfConfig(ReadFixture("gemma-3-1b-it.config.json"));
  EXPECT_EQ(g3.num_layers, 26);
  EXPECT_EQ(g3.hidden_size, 1152);
  EXPECT_EQ(g3.num_query_groups, 1);
  EXPECT_EQ(g3.kv_channels, 256);
  EXPECT_EQ(g3.vocab_size, 262144);
  EXPECT_FALSE(g3.untie_embeddings);
  EXPECT_EQ(g3.window_size, 512);
  EXPECT_EQ(g3.window_attn_skip_freq, 6);        // sliding_window_pattern: 5 local, then 1 global
  EXPECT_EQ(g3.num_windowed_layers(0, 26), 22);  // global: layers 6, 12, 18, 24 (1-based)

  // The same pattern written as layer_types.
  std::string types = "\"layer_types\": [";
  for (int i = 0; i < 26; ++i) {
    types += std::string(i ? ", " : "") +
             ((i + 1) % 6 == 0 ? "\"full_attention\"" : "\"sliding_attention\"");
  }
  types += "],";
  const std::string text = ReadFixture("gemma-3-1b-it.config.json");
  const std::string listed = Replace(Replace(text, "\"sliding_window_pattern\": 6,", ""),
                                     "\"head_dim\"", types + "\"head_dim\"");
  EXPECT_EQ(ModelFromHfConfig(listed).window_attn_skip_freq, 6);
  // A pattern of 1 makes every layer global.
  const ModelSpec global = ModelFromHfConfig(
      Replace(text, "\"sliding_window_pattern\": 6", "\"sliding_window_pattern\": 1"));
  EXPECT_EQ(global.window_size, 0);
  EXPECT_EQ(global.window_attn_skip_freq, 0);
}

TEST(SpecHfFamilies, Phi3AndMistralWindowEveryLayer) {
  const ModelSpec phi = ModelFromHfConfig(ReadFixture("phi-3-mini-4k-instruct.config.json"));
  EXPECT_EQ(phi.name, "Phi-3-mini-4k-instruct");
  EXPECT_EQ(phi.num_layers, 32);
  EXPECT_EQ(phi.hidden_size, 3072);
  EXPECT_EQ(phi.ffn_hidden_size, 8192);
  EXPECT_EQ(phi.num_query_groups, 32);
  EXPECT_EQ(phi.kv_channels, 0);
  EXPECT_EQ(phi.vocab_size, 32064);
  EXPECT_TRUE(phi.untie_embeddings);
  EXPECT_EQ(phi.window_size, 2047);
  EXPECT_EQ(phi.window_attn_skip_freq, 0);
  const ModelSpec no_window =
      ModelFromHfConfig(Replace(ReadFixture("phi-3-mini-4k-instruct.config.json"),
                                "\"sliding_window\": 2047", "\"sliding_window\": null"));
  EXPECT_EQ(no_window.window_size, 0);

  const ModelSpec mistral = ModelFromHfConfig(ReadFixture("mistral-7b-v0.1.config.json"));
  EXPECT_EQ(mistral.window_size, 4096);
  EXPECT_EQ(mistral.num_windowed_layers(0, 32), 32);
  // Mixtral's config has "sliding_window": null: full attention, as the preset.
  EXPECT_EQ(ModelFromHfConfig(ReadFixture("mixtral-8x7b-v0.1.config.json")).window_size, 0);
}

TEST(SpecHfFamilies, LayerTypesMustBeEveryNthLayerFull) {
  const std::string text = ReadFixture("gpt-oss-20b.config.json");
  std::string message;
  // full, full, sliding, ...: not periodic.
  EXPECT_EQ(
      ErrorField(
          [&] { ModelFromHfConfig(Replace(text, "\"sliding_attention\"", "\"full_attention\"")); },
          &message),
      "layer_types");
  EXPECT_NE(message.find("--window-attn-skip-freq"), std::string::npos) << message;
  EXPECT_EQ(
      ErrorField(
          [&] {
            ModelFromHfConfig(Replace(text, "\"sliding_attention\"", "\"chunked_attention\""));
          },
          &message),
      "layer_types");
  EXPECT_NE(message.find("sliding_attention|full_attention"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(Replace(text, "\"sliding_attention\",", "")); }),
            "layer_types");
  // Every layer full: no window at all.
  std::string all_full = text;
  for (size_t at; (at = all_full.find("\"sliding_attention\"")) != std::string::npos;) {
    all_full.replace(at, 19, "\"full_attention\"");
  }
  EXPECT_EQ(ModelFromHfConfig(all_full).window_size, 0);
}

TEST(SpecHfFamilies, QwenWindowOnlyWithUseSlidingWindow) {
  const std::string qwen = R"({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 28,
      "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
      "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
      "sliding_window": 131072, "max_window_layers": 28, "use_sliding_window": false})";
  EXPECT_EQ(ModelFromHfConfig(qwen).window_size, 0);
  const std::string used = Replace(qwen, "false", "true");
  EXPECT_EQ(ModelFromHfConfig(used).window_size, 0);  // max_window_layers covers every layer
  EXPECT_EQ(
      ModelFromHfConfig(Replace(used, "\"max_window_layers\": 28", "\"max_window_layers\": 0"))
          .window_size,
      131072);
  EXPECT_EQ(
      ErrorField([&] {
        ModelFromHfConfig(Replace(used, "\"max_window_layers\": 28", "\"max_window_layers\": 20"));
      }),
      "max_window_layers");
}

// ---- query and key norms ----

// Qwen3 (dense and MoE) and Gemma-3 normalize each query and key head (q_norm, k_norm), DeepSeek
// its latents (q_a_layernorm, kv_a_layernorm): Megatron-core's --qk-layernorm. Llama, Qwen2 and
// Gemma-2 do not.
TEST(SpecQkLayernorm, EverySpellingReadsIt) {
  for (const char* on : {"qwen3-30b-a3b.config.json", "qwen3-235b-a22b.config.json",
                         "gemma-3-1b-it.config.json", "deepseek-v3.config.json"}) {
    EXPECT_TRUE(ModelFromHfConfig(ReadFixture(on)).qk_layernorm) << on;
  }
  for (const char* off :
       {"llama-2-7b-hf.config.json", "gemma-2-9b.config.json", "mistral-7b-v0.1.config.json"}) {
    EXPECT_FALSE(ModelFromHfConfig(ReadFixture(off)).qk_layernorm) << off;
  }
  // Qwen3-8B's config.json (the fields read).
  const std::string qwen3_8b = R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
      "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
      "max_position_embeddings": 40960, "tie_word_embeddings": false})";
  EXPECT_TRUE(ModelFromHfConfig(qwen3_8b).qk_layernorm);
  EXPECT_FALSE(
      ModelFromHfConfig(Replace(qwen3_8b, "Qwen3ForCausalLM", "Qwen2ForCausalLM")).qk_layernorm);

  EXPECT_TRUE(ModelFromYaml("base: llama2-7b\nqk_layernorm: true\n").qk_layernorm);
  EXPECT_FALSE(ModelFromYaml("base: llama2-7b\nqk_layernorm: false\n").qk_layernorm);
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: llama2-7b\nqk_layernorm: sometimes\n"); }),
            "qk_layernorm");
  const auto flags = [](const std::string& line) {
    return ApplyMegatronFlags(SplitCommandLine(line), ModelPreset("llama2-7b"), TrainSpec()).model;
  };
  EXPECT_TRUE(flags("--qk-layernorm").qk_layernorm);
  EXPECT_FALSE(flags("--swiglu").qk_layernorm);
  EXPECT_EQ(ErrorField([&] { flags("--qk-layernorm=yes"); }), "--qk-layernorm");
}

// ---- multi-token prediction, keys nobody reads ----

TEST(SpecHfFamilies, DeepseekMtpLayersAreKept) {
  const ModelSpec m = ModelFromHfConfig(ReadFixture("deepseek-v3.config.json"));
  EXPECT_EQ(m.mtp_num_layers, 1);  // num_nextn_predict_layers
  const ModelSpec none = ModelFromHfConfig(Replace(ReadFixture("deepseek-v3.config.json"),
                                                   "\"num_nextn_predict_layers\": 1",
                                                   "\"num_nextn_predict_layers\": 0"));
  EXPECT_EQ(none.mtp_num_layers, 0);
}

TEST(SpecHfFamilies, MoeLookingKeysNobodyReadsAreErrors) {
  std::string message;
  // A misspelt expert count would have imported DeepSeek-V3 as a 37B dense model.
  const std::string deepseek = ReadFixture("deepseek-v3.config.json");
  EXPECT_EQ(
      ErrorField(
          [&] {
            ModelFromHfConfig(Replace(deepseek, "\"n_routed_experts\"", "\"n_routed_expert\""));
          },
          &message),
      "n_routed_expert");
  EXPECT_NE(message.find("DeepseekV3ForCausalLM"), std::string::npos) << message;
  EXPECT_NE(message.find("smaller model"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([&] {
              ModelFromHfConfig(
                  Replace(deepseek, "\"num_nextn_predict_layers\"", "\"num_nextn_predict_layer\""));
            }),
            "num_nextn_predict_layer");
  // Expert keys on an architecture without experts.
  const std::string llama = Replace(ReadFixture("llama-2-7b-hf.config.json"), "\"vocab_size\"",
                                    "\"num_local_experts\": 8, \"vocab_size\"");
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(llama); }, &message), "num_local_experts");
  EXPECT_NE(message.find("none"), std::string::npos) << message;
  // Qwen3-MoE's expert count is required, so a misspelling is a missing key.
  EXPECT_EQ(ErrorField([&] {
              ModelFromHfConfig(Replace(ReadFixture("qwen3-30b-a3b.config.json"), "\"num_experts\"",
                                        "\"num_expert\""));
            }),
            "num_experts");
  // MoE-looking keys the families do read pass.
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(deepseek); }), "");
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(ReadFixture("gpt-oss-20b.config.json")); }), "");
}

// ---- the window in ModelSpec, YAML and Megatron-LM flags ----

TEST(SpecWindow, WindowedLayersFollowMegatronsRule) {
  ModelSpec m = ModelPreset("llama2-7b");
  m.num_layers = 26;
  EXPECT_EQ(m.num_windowed_layers(0, 26), 0);  // no window
  m.window_size = 512;
  EXPECT_EQ(m.num_windowed_layers(0, 26), 26);  // every layer
  m.window_attn_skip_freq = 6;  // layers 6, 12, 18, 24 (1-based) keep full attention
  EXPECT_TRUE(m.is_windowed_layer(0));
  EXPECT_FALSE(m.is_windowed_layer(5));
  EXPECT_FALSE(m.is_windowed_layer(23));
  EXPECT_EQ(m.num_windowed_layers(0, 26), 22);
  EXPECT_EQ(m.num_windowed_layers(13, 13), 11);  // 1-based 14..26: 18 and 24 are full
  EXPECT_EQ(m.num_windowed_layers(5, 1), 0);
  int64_t counted = 0;
  for (int64_t layer = 7; layer < 20; ++layer) counted += m.is_windowed_layer(layer) ? 1 : 0;
  EXPECT_EQ(m.num_windowed_layers(7, 13), counted);
}

TEST(SpecWindow, YamlAndMegatronFlagsSpellIt) {
  const ModelSpec yaml = ModelFromYaml(
      "base: llama2-7b\nwindow_size: 4096\nwindow_attn_skip_freq: 2\nmtp_num_layers: 1\n");
  EXPECT_EQ(yaml.window_size, 4096);
  EXPECT_EQ(yaml.window_attn_skip_freq, 2);
  EXPECT_EQ(yaml.mtp_num_layers, 1);

  const auto flags = [](const std::string& line) {
    return ApplyMegatronFlags(SplitCommandLine(line), ModelPreset("llama2-7b"), TrainSpec()).model;
  };
  const ModelSpec oss = flags("--window-size 128,0 --window-attn-skip-freq 2 --mtp-num-layers 1");
  EXPECT_EQ(oss.window_size, 128);
  EXPECT_EQ(oss.window_attn_skip_freq, 2);
  EXPECT_EQ(oss.mtp_num_layers, 1);
  EXPECT_EQ(flags("--window-size=(4096,0)").window_size, 4096);
  EXPECT_EQ(flags("--window-size -1,0").window_size, 0);  // -1: no window

  const auto flag_error = [&](const std::string& line) { return ErrorField([&] { flags(line); }); };
  EXPECT_EQ(flag_error("--window-size 4096,4096"), "--window-size");  // not causal
  EXPECT_EQ(flag_error("--window-size 4096"), "--window-size");
  EXPECT_EQ(flag_error("--window-size 0,0"), "--window-size");
  EXPECT_EQ(flag_error("--window-attn-skip-freq 2"), "--window-attn-skip-freq");  // no window
  EXPECT_EQ(flag_error("--window-size 128,0 --window-attn-skip-freq [1,0]*16"),
            "--window-attn-skip-freq");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: llama2-7b\nwindow_attn_skip_freq: 2\n"); }),
            "window_attn_skip_freq");
  EXPECT_EQ(ErrorField([] { ModelFromYaml("base: llama2-7b\nwindow_size: -1\n"); }), "window_size");
}

}  // namespace
}  // namespace autopar
