// Presets: every one validates, and the parameter-relevant fields of the well-known models give
// their published parameter counts.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "spec_test_util.h"

namespace autopar {
namespace {

// Total parameters of a decoder, counted here independently of src/perf so that a wrong preset
// field shows up as a wrong total. Counts what the published totals count: embeddings, attention
// (MHA/GQA or MLA), MLPs (dense, routed and shared experts, router), norms, linear biases.
int64_t ParameterCount(const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  const int64_t a = m.num_attention_heads;
  const int64_t norm = m.norm == NormKind::kLayerNorm ? 2 * h : h;  // LayerNorm has a bias
  int64_t attention = 0;
  if (m.kv_lora_rank > 0) {
    const int64_t qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    const int64_t q =
        m.q_lora_rank > 0 ? h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk : h * a * qk;
    const int64_t kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank +
                       m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim);
    attention = q + kv + a * m.v_head_dim * h;
  } else {
    const int64_t d = m.head_dim();
    const int64_t qkv = h * d * (a + 2 * m.num_query_groups);
    attention = qkv + a * d * h;
    if (m.add_bias_linear) attention += d * (a + 2 * m.num_query_groups) + h;
  }
  const auto mlp = [&](int64_t width) {
    if (width == 0) return int64_t{0};
    const int64_t matrices = m.activation == Activation::kSwiGLU ? 3 : 2;
    const int64_t bias = m.add_bias_linear ? (matrices - 1) * width + h : 0;
    return matrices * h * width + bias;
  };
  const int64_t dense_layer = attention + mlp(m.ffn_hidden_size) + 2 * norm;
  const int64_t moe_layer = attention + m.num_experts * mlp(m.moe_ffn_hidden_size) +
                            mlp(m.moe_shared_expert_intermediate_size) + h * m.num_experts +
                            2 * norm;
  int64_t total =
      m.num_moe_layers() * moe_layer + (m.num_layers - m.num_moe_layers()) * dense_layer;
  total += m.vocab_size * h + norm;  // input embedding and final norm
  if (m.untie_embeddings) total += m.vocab_size * h;
  if (m.position_embedding == PositionEmbedding::kLearned) total += m.max_position_embeddings * h;
  return total;
}

TEST(SpecModelPresets, EveryPresetValidatesUnderItsOwnName) {
  const std::vector<std::string> names = ModelPresetNames();
  EXPECT_GE(names.size(), 16u);
  std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size()) << "duplicate preset names";
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(HasModelPreset(name));
    const ModelSpec m = ModelPreset(name);
    EXPECT_EQ(m.name, name);
    EXPECT_NO_THROW(Validate(m));
    EXPECT_GT(m.max_position_embeddings, 0);
  }
  for (const char* name :
       {"llama-7b", "llama-13b", "llama-65b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
        "llama3-70b", "llama3-405b", "gpt3-175b", "glm-130b", "galactica-30b", "galactica-120b",
        "mixtral-8x7b", "deepseek-v3", "qwen2.5-72b", "tiny", "tiny-gpt"}) {
    EXPECT_TRUE(HasModelPreset(name)) << name;
  }
}

TEST(SpecModelPresets, LookupIgnoresCase) {
  EXPECT_TRUE(HasModelPreset("LLaMA2-70B"));
  EXPECT_EQ(ModelPreset("Mixtral-8x7B").name, "mixtral-8x7b");
  EXPECT_FALSE(HasModelPreset("llama2-71b"));
}

TEST(SpecModelPresets, UnknownNameNamesTheFlagAndListsPresets) {
  try {
    ModelPreset("llama5-1t");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--model");
    const std::string what = e.what();
    EXPECT_NE(what.find("llama5-1t"), std::string::npos) << what;
    for (const std::string& name : ModelPresetNames()) {
      EXPECT_NE(what.find(name), std::string::npos) << what;
    }
  }
}

TEST(SpecModelPresets, Llama2Architectures) {
  const ModelSpec m7 = ModelPreset("llama2-7b");
  EXPECT_EQ(m7.num_layers, 32);
  EXPECT_EQ(m7.hidden_size, 4096);
  EXPECT_EQ(m7.ffn_hidden_size, 11008);
  EXPECT_EQ(m7.num_attention_heads, 32);
  EXPECT_EQ(m7.num_query_groups, 32);
  EXPECT_EQ(m7.head_dim(), 128);
  EXPECT_EQ(m7.vocab_size, 32000);
  EXPECT_EQ(m7.max_position_embeddings, 4096);
  EXPECT_EQ(m7.activation, Activation::kSwiGLU);
  EXPECT_EQ(m7.norm, NormKind::kRMSNorm);
  EXPECT_EQ(m7.position_embedding, PositionEmbedding::kRope);
  EXPECT_TRUE(m7.untie_embeddings);
  EXPECT_FALSE(m7.add_bias_linear);
  EXPECT_FALSE(m7.is_moe());
  EXPECT_EQ(ParameterCount(m7), 6'738'415'616);  // Llama-2-7b-hf safetensors total

  const ModelSpec m70 = ModelPreset("llama2-70b");
  EXPECT_EQ(m70.num_layers, 80);
  EXPECT_EQ(m70.hidden_size, 8192);
  EXPECT_EQ(m70.ffn_hidden_size, 28672);
  EXPECT_EQ(m70.num_attention_heads, 64);
  EXPECT_EQ(m70.num_query_groups, 8);
  EXPECT_EQ(ParameterCount(m70), 68'976'648'192);
}

TEST(SpecModelPresets, PublishedParameterCounts) {
  EXPECT_EQ(ParameterCount(ModelPreset("llama-65b")), 65'285'660'672);
  EXPECT_EQ(ParameterCount(ModelPreset("llama3-8b")), 8'030'261'248);
  EXPECT_EQ(ParameterCount(ModelPreset("llama3-405b")), 405'853'388'800);
  // Qwen2.5-72B's published 72.7B includes QKV biases (80 x 10240), which the spec leaves out.
  EXPECT_EQ(ParameterCount(ModelPreset("qwen2.5-72b")) + int64_t{80} * (8192 + 2 * 1024),
            72'706'203'648);
  const double gpt3 = static_cast<double>(ParameterCount(ModelPreset("gpt3-175b")));
  EXPECT_NEAR(gpt3, 174.6e9, 0.2e9);
}

TEST(SpecModelPresets, Gpt3IsMegatronStyle) {
  const ModelSpec m = ModelPreset("gpt3-175b");
  EXPECT_EQ(m.num_layers, 96);
  EXPECT_EQ(m.hidden_size, 12288);
  EXPECT_EQ(m.ffn_hidden_size, 4 * 12288);
  EXPECT_EQ(m.num_attention_heads, 96);
  EXPECT_EQ(m.num_query_groups, 96);
  EXPECT_EQ(m.vocab_size, 51200);
  EXPECT_EQ(m.max_position_embeddings, 2048);
  EXPECT_EQ(m.activation, Activation::kGeLU);
  EXPECT_EQ(m.norm, NormKind::kLayerNorm);
  EXPECT_EQ(m.position_embedding, PositionEmbedding::kLearned);
  EXPECT_FALSE(m.untie_embeddings);
  EXPECT_TRUE(m.add_bias_linear);
}

TEST(SpecModelPresets, Mixtral) {
  const ModelSpec m = ModelPreset("mixtral-8x7b");
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(m.num_query_groups, 8);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_ffn_hidden_size, 14336);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 0);
  EXPECT_EQ(m.num_moe_layers(), 32);
  EXPECT_EQ(ParameterCount(m), 46'702'792'704);
}

TEST(SpecModelPresets, DeepSeekV3) {
  const ModelSpec m = ModelPreset("deepseek-v3");
  EXPECT_EQ(m.num_layers, 61);
  EXPECT_EQ(m.hidden_size, 7168);
  EXPECT_EQ(m.ffn_hidden_size, 18432);
  EXPECT_EQ(m.num_attention_heads, 128);
  EXPECT_EQ(m.vocab_size, 129280);
  EXPECT_TRUE(m.is_mla());
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.qk_head_dim, 128);
  EXPECT_EQ(m.qk_pos_emb_head_dim, 64);
  EXPECT_EQ(m.v_head_dim, 128);
  EXPECT_EQ(m.num_experts, 256);
  EXPECT_EQ(m.moe_router_topk, 8);
  EXPECT_EQ(m.moe_ffn_hidden_size, 2048);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 2048);
  EXPECT_EQ(m.moe_first_dense_layers, 3);
  EXPECT_EQ(m.num_moe_layers(), 58);
  // 671B main model (the report's figure leaves out the 14B multi-token-prediction module); the
  // router's 256 per-layer score-correction biases are not modelled.
  EXPECT_NEAR(static_cast<double>(ParameterCount(m)), 671.0e9, 0.1e9);
}

TEST(SpecGpuPresets, EveryPresetValidatesAndCitesASource) {
  const std::vector<std::string> names = GpuPresetNames();
  for (const char* name : {"a100-40gb", "a100-80gb", "a800", "h100", "h800", "h200", "b200", "b300",
                           "gb200", "gb300", "ascend-910b"}) {
    EXPECT_TRUE(HasGpuPreset(name)) << name;
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const GpuSpec g = GpuPreset(name);
    EXPECT_EQ(g.name, name);
    EXPECT_NO_THROW(Validate(g));
    EXPECT_GT(g.source.size(), 40u);
    // Per-direction bandwidths: NVLink-class links beat the NIC share, HBM beats both.
    EXPECT_GT(g.intra_node_bandwidth, g.inter_node_bandwidth);
    EXPECT_GT(g.hbm_bandwidth, g.intra_node_bandwidth);
    EXPECT_GT(g.inter_node_latency_s, 0);
  }
}

TEST(SpecGpuPresets, KnownFigures) {
  const GpuSpec a100 = GpuPreset("A100-80GB");
  EXPECT_DOUBLE_EQ(a100.peak_flops_bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.peak_flops_fp8, 0);
  EXPECT_DOUBLE_EQ(a100.hbm_bandwidth, 2.039e12);
  EXPECT_DOUBLE_EQ(a100.intra_node_bandwidth, 300e9);
  EXPECT_DOUBLE_EQ(a100.inter_node_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(GpuPreset("a100-40gb").hbm_bandwidth, 1.555e12);
  EXPECT_DOUBLE_EQ(GpuPreset("a800").intra_node_bandwidth, 200e9);

  const GpuSpec h100 = GpuPreset("h100");
  EXPECT_DOUBLE_EQ(h100.peak_flops_fp8, 1979e12);
  EXPECT_DOUBLE_EQ(h100.peak_flops_fp32, 67e12);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.intra_node_bandwidth, 450e9);
  EXPECT_DOUBLE_EQ(h100.inter_node_bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(GpuPreset("h800").intra_node_bandwidth, 200e9);
  EXPECT_DOUBLE_EQ(GpuPreset("h800").peak_flops_bf16, h100.peak_flops_bf16);
  EXPECT_DOUBLE_EQ(GpuPreset("h200").hbm_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(GpuPreset("h200").peak_flops_bf16, h100.peak_flops_bf16);
  EXPECT_DOUBLE_EQ(GpuPreset("b200").peak_flops_bf16, 2.25e15);
  EXPECT_DOUBLE_EQ(GpuPreset("b200").intra_node_bandwidth, 900e9);
  EXPECT_DOUBLE_EQ(GpuPreset("ascend-910b").peak_flops_fp8, 0);
}

TEST(SpecGpuPresets, BlackwellUltraAndTheNvl72Racks) {
  const GpuSpec b300 = GpuPreset("b300");
  EXPECT_DOUBLE_EQ(b300.peak_flops_bf16, 2.25e15);
  EXPECT_DOUBLE_EQ(b300.peak_flops_fp8, 4.5e15);
  EXPECT_DOUBLE_EQ(b300.intra_node_bandwidth, 900e9);
  EXPECT_DOUBLE_EQ(b300.inter_node_bandwidth, 100e9);  // ConnectX-8, 800 Gb/s per GPU
  EXPECT_EQ(b300.nvlink_domain_gpus, 0);               // the 8-GPU HGX board
  for (const char* name : {"gb200", "gb300"}) {
    SCOPED_TRACE(name);
    const GpuSpec g = GpuPreset(name);
    EXPECT_DOUBLE_EQ(g.peak_flops_bf16, 2.5e15);
    EXPECT_DOUBLE_EQ(g.peak_flops_fp8, 5e15);
    EXPECT_DOUBLE_EQ(g.hbm_bandwidth, 8e12);
    EXPECT_DOUBLE_EQ(g.intra_node_bandwidth, 900e9);  // NVLink 5, per direction
    EXPECT_EQ(g.nvlink_domain_gpus, 72);
    EXPECT_NE(g.source.find("NVL72"), std::string::npos) << g.source;
  }
  EXPECT_DOUBLE_EQ(GpuPreset("gb200").inter_node_bandwidth, 50e9);   // ConnectX-7, 400 Gb/s
  EXPECT_DOUBLE_EQ(GpuPreset("gb300").inter_node_bandwidth, 100e9);  // ConnectX-8, 800 Gb/s
  // Every other preset is an HGX-style board: its NVLink domain is the node.
  for (const std::string& name : GpuPresetNames()) {
    if (name != "gb200" && name != "gb300") {
      EXPECT_EQ(GpuPreset(name).nvlink_domain_gpus, 0) << name;
    }
  }
}

TEST(SpecGpuPresets, MemoryIsWhatTheRuntimeReportsInGiB) {
  // Below the marketed size read as GiB (80 GB parts have 80 GiB of HBM, less what the driver
  // keeps), above the marketed size read as decimal GB (80e9 bytes = 74.5 GiB).
  const auto within = [](const char* name, double marketed_gb) {
    const double gib = GpuPreset(name).memory_gib;
    EXPECT_LT(gib, marketed_gb) << name;
    EXPECT_GT(gib, marketed_gb * 1e9 / (1u << 30)) << name;
  };
  within("a100-40gb", 40);
  within("a100-80gb", 80);
  within("a800", 80);
  within("h100", 80);
  within("h800", 80);
  within("h200", 141);
  within("b200", 180);
  within("b300", 270);   // the B300 SXM6 AC: 15 of its 16 memory controllers, 288·15/16 GB
  within("gb200", 186);  // NVIDIA's 13.4 TB per NVL72 rack
  within("gb300", 288);
  within("ascend-910b", 64);
}

TEST(SpecGpuPresets, UnknownNameNamesTheFlagAndListsPresets) {
  try {
    GpuPreset("v100");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--gpu");
    const std::string what = e.what();
    for (const std::string& name : GpuPresetNames()) {
      EXPECT_NE(what.find(name), std::string::npos) << what;
    }
  }
}

// Every field of every GPU preset, one line each, doubles as hexadecimal floats (exact) and in
// decimal (to read): the golden file tests/data/spec/gpu_presets.golden was written from the
// presets as C++ code, before they moved to src/spec/gpu_presets.yaml, so a figure that changes by
// one bit while being edited or moved fails here.
std::string DumpGpuPresets() {
  std::ostringstream out;
  const auto number = [&](const std::string& gpu, const char* field, double v) {
    char line[160];
    std::snprintf(line, sizeof line, "%s %s %.17g %a\n", gpu.c_str(), field, v, v);
    out << line;
  };
  for (const std::string& name : GpuPresetNames()) {
    const GpuSpec g = GpuPreset(name);
    out << name << " name " << g.name << "\n";
    number(name, "memory_gib", g.memory_gib);
    number(name, "peak_flops_bf16", g.peak_flops_bf16);
    number(name, "peak_flops_fp16", g.peak_flops_fp16);
    number(name, "peak_flops_fp8", g.peak_flops_fp8);
    number(name, "peak_flops_fp32", g.peak_flops_fp32);
    number(name, "hbm_bandwidth", g.hbm_bandwidth);
    number(name, "intra_node_bandwidth", g.intra_node_bandwidth);
    number(name, "intra_node_latency_s", g.intra_node_latency_s);
    number(name, "inter_node_bandwidth", g.inter_node_bandwidth);
    number(name, "inter_node_latency_s", g.inter_node_latency_s);
    out << name << " nvlink_domain_gpus " << g.nvlink_domain_gpus << "\n";
    out << name << " source " << g.source << "\n";
  }
  return out.str();
}

TEST(SpecGpuPresets, EveryFieldMatchesTheGoldenList) {
  const std::string actual = DumpGpuPresets();
  const std::string golden = ReadFixture("gpu_presets.golden");
  if (actual != golden) {
    // Written next to the test binary so that an intended change is one `cp` away.
    const std::string path = std::string(AUTOPAR_BINARY_DIR) + "/gpu_presets.actual";
    std::ofstream(path) << actual;
    FAIL() << "GPU presets differ from tests/data/spec/gpu_presets.golden; these presets are in "
           << path << " (diff them; copy over the golden file only for an intended change)";
  }
}

}  // namespace
}  // namespace autopar
