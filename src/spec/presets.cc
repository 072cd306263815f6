// Built-in model and GPU presets.
//
// Model figures are the published architectures (papers and the models' own config.json files);
// tests/unit/spec_parse_test.cc checks several against Hugging Face configs. GPU figures are data,
// src/spec/gpu_presets.yaml, each entry with a `source` naming where each figure comes from.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::Join;
using spec_internal::kGpuPresetsYaml;
using spec_internal::Lower;
using spec_internal::NodeDouble;
using spec_internal::NodeInt;
using spec_internal::NodeString;

// LLaMA-style decoder: SwiGLU, RMSNorm, RoPE, separate output layer, no biases (ModelSpec's own
// defaults). groups == heads means plain multi-head attention.
ModelSpec Llama(std::string name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                int64_t groups, int64_t vocab, int64_t max_positions) {
  ModelSpec m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.ffn_hidden_size = ffn;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.vocab_size = vocab;
  m.max_position_embeddings = max_positions;
  return m;
}

// GPT-3-style decoder: GeLU, LayerNorm, learned absolute positions, tied embeddings, biases.
ModelSpec Gpt(std::string name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
              int64_t vocab, int64_t max_positions) {
  ModelSpec m = Llama(std::move(name), layers, hidden, ffn, heads, heads, vocab, max_positions);
  m.activation = Activation::kGeLU;
  m.norm = NormKind::kLayerNorm;
  m.position_embedding = PositionEmbedding::kLearned;
  m.untie_embeddings = false;
  m.add_bias_linear = true;
  return m;
}

std::vector<ModelSpec> BuildModelPresets() {
  std::vector<ModelSpec> p;
  // LLaMA (Touvron et al. 2023, Table 2; 2048-token context, 32000-token SentencePiece vocab).
  p.push_back(Llama("llama-7b", 32, 4096, 11008, 32, 32, 32000, 2048));
  p.push_back(Llama("llama-13b", 40, 5120, 13824, 40, 40, 32000, 2048));
  p.push_back(Llama("llama-65b", 80, 8192, 22016, 64, 64, 32000, 2048));
  // Llama 2: 4096-token context; only 70B uses grouped-query attention (8 KV heads).
  p.push_back(Llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096));
  p.push_back(Llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096));
  p.push_back(Llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096));
  // Llama 3: 128K tokenizer, GQA with 8 KV heads everywhere. 8B/70B as first released (8192
  // context); 405B exists only as Llama 3.1, whose config.json says 131072 positions.
  p.push_back(Llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192));
  p.push_back(Llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192));
  p.push_back(Llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 131072));
  // Qwen2.5-72B has biases on the QKV projections; at 3 x 8192 + 2 x 1024 per layer they are
  // negligible and not modelled.
  p.push_back(Llama("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, 32768));

  // GPT-3 175B (Brown et al. 2020), vocabulary padded to 51200 as Megatron-LM does.
  p.push_back(Gpt("gpt3-175b", 96, 12288, 49152, 96, 51200, 2048));

  // GLM-130B (Zeng et al. 2022): GeGLU MLP, which has SwiGLU's three-matrix shape; RoPE,
  // LayerNorm (DeepNorm), biases, embeddings shared with the output layer.
  ModelSpec glm = Llama("glm-130b", 70, 12288, 32768, 96, 96, 150528, 2048);
  glm.norm = NormKind::kLayerNorm;
  glm.untie_embeddings = false;
  glm.add_bias_linear = true;
  p.push_back(glm);

  // Galactica (Taylor et al. 2022): OPT-style with GeLU and no biases anywhere.
  ModelSpec galactica_30b = Gpt("galactica-30b", 48, 7168, 28672, 56, 50000, 2048);
  galactica_30b.add_bias_linear = false;
  p.push_back(galactica_30b);
  ModelSpec galactica_120b = Gpt("galactica-120b", 96, 10240, 40960, 80, 50000, 2048);
  galactica_120b.add_bias_linear = false;
  p.push_back(galactica_120b);

  // Mixtral 8x7B: every layer is MoE, 8 experts of width 14336, top-2 routing.
  ModelSpec mixtral = Llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768);
  mixtral.num_experts = 8;
  mixtral.moe_router_topk = 2;
  mixtral.moe_ffn_hidden_size = 14336;
  p.push_back(mixtral);

  // DeepSeek-V3 (DeepSeek-AI 2024 and its config.json): MLA, 3 dense layers then 58 MoE layers of
  // 256 routed experts (top-8) plus 1 shared expert, all 2048 wide. Pre-trained at 4K tokens;
  // config.json and Megatron-LM's recipe give 163840 positions. Megatron's recipe passes
  // --kv-channels 128 (= v_head_dim); MLA itself uses the qk/v head dims.
  ModelSpec deepseek = Llama("deepseek-v3", 61, 7168, 18432, 128, 128, 129280, 163840);
  deepseek.kv_channels = 128;
  deepseek.q_lora_rank = 1536;
  deepseek.kv_lora_rank = 512;
  deepseek.qk_head_dim = 128;
  deepseek.qk_pos_emb_head_dim = 64;
  deepseek.v_head_dim = 128;
  deepseek.qk_layernorm = true;  // the latent norms (config.json's q_a_layernorm, kv_a_layernorm)
  deepseek.num_experts = 256;
  deepseek.moe_router_topk = 8;
  deepseek.moe_ffn_hidden_size = 2048;
  deepseek.moe_shared_expert_intermediate_size = 2048;
  deepseek.moe_first_dense_layers = 3;
  p.push_back(deepseek);

  // Small models for CPU tests and the laptop demo.
  p.push_back(Llama("tiny", 4, 64, 176, 4, 2, 256, 64));
  p.push_back(Gpt("tiny-gpt", 4, 64, 256, 4, 256, 64));
  ModelSpec tiny_moe = Llama("tiny-moe", 4, 64, 176, 4, 2, 256, 64);
  tiny_moe.num_experts = 4;
  tiny_moe.moe_router_topk = 2;
  tiny_moe.moe_ffn_hidden_size = 64;
  tiny_moe.moe_shared_expert_intermediate_size = 64;
  tiny_moe.moe_first_dense_layers = 1;
  p.push_back(tiny_moe);
  return p;
}

// The GPU presets are data: src/spec/gpu_presets.yaml (its header says what each key means),
// compiled in as kGpuPresetsYaml. Malformed data is refused naming the file, the entry and the
// key; tests/unit/spec_presets_test.cc reads every entry, so it fails there first.
constexpr char kGpuPresetsFile[] = "src/spec/gpu_presets.yaml";

struct GpuFigure {
  const char* key;
  double GpuSpec::*member;
};

constexpr GpuFigure kGpuFigures[] = {
    {"memory_gib", &GpuSpec::memory_gib},
    {"peak_flops_bf16", &GpuSpec::peak_flops_bf16},
    {"peak_flops_fp16", &GpuSpec::peak_flops_fp16},
    {"peak_flops_fp8", &GpuSpec::peak_flops_fp8},
    {"peak_flops_fp32", &GpuSpec::peak_flops_fp32},
    {"hbm_bandwidth", &GpuSpec::hbm_bandwidth},
    {"intra_node_bandwidth", &GpuSpec::intra_node_bandwidth},
    {"intra_node_latency_s", &GpuSpec::intra_node_latency_s},
    {"inter_node_bandwidth", &GpuSpec::inter_node_bandwidth},
    {"inter_node_latency_s", &GpuSpec::inter_node_latency_s},
};

// The preset named `name` among those read so far (a `base` must come before its users).
const GpuSpec& GpuBase(const std::vector<GpuSpec>& above, const std::string& name,
                       const std::string& field) {
  for (const GpuSpec& g : above) {
    if (g.name == name) return g;
  }
  throw InputError(field, "no entry '" + name + "' above this one");
}

// One entry: its `base`'s figures (if any), then every key it gives.
GpuSpec GpuEntry(const YAML::Node& entry, const std::vector<GpuSpec>& above) {
  const std::string where =
      std::string(kGpuPresetsFile) + ": entry " + std::to_string(above.size() + 1) + ": ";
  if (!entry.IsMap()) throw InputError(where, "expected a mapping of GpuSpec fields");
  GpuSpec g;
  if (const YAML::Node base = entry["base"]) {
    g = GpuBase(above, NodeString(base, where + "base"), where + "base");
  }
  for (const auto& kv : entry) {
    const std::string key = NodeString(kv.first, where + "<key>");
    const std::string field = where + key;
    if (key == "base") continue;
    if (key == "name") {
      g.name = NodeString(kv.second, field);
    } else if (key == "source") {
      g.source = NodeString(kv.second, field);
    } else if (key == "nvlink_domain_gpus") {
      g.nvlink_domain_gpus = NodeInt(kv.second, field);
    } else {
      const auto* figure = std::find_if(std::begin(kGpuFigures), std::end(kGpuFigures),
                                        [&](const GpuFigure& f) { return key == f.key; });
      if (figure == std::end(kGpuFigures)) throw InputError(field, "not a GpuSpec field");
      g.*(figure->member) = NodeDouble(kv.second, field);
    }
  }
  if (g.name.empty() || g.source.empty()) throw InputError(where, "needs a name and a source");
  return g;
}

std::vector<GpuSpec> BuildGpuPresets() {
  const YAML::Node doc = YAML::Load(kGpuPresetsYaml);
  if (!doc.IsSequence()) throw InputError(kGpuPresetsFile, "expected a list of GPU entries");
  std::vector<GpuSpec> presets;
  for (const YAML::Node& entry : doc) {
    GpuSpec g = GpuEntry(entry, presets);
    for (const GpuSpec& other : presets) {
      if (other.name == g.name) throw InputError(kGpuPresetsFile, "two entries named " + g.name);
    }
    presets.push_back(std::move(g));
  }
  return presets;
}

const std::vector<ModelSpec>& ModelPresets() {
  static const std::vector<ModelSpec> presets = BuildModelPresets();
  return presets;
}

const std::vector<GpuSpec>& GpuPresets() {
  static const std::vector<GpuSpec> presets = BuildGpuPresets();
  return presets;
}

template <typename Spec>
const Spec* Find(const std::vector<Spec>& presets, const std::string& name) {
  const std::string wanted = Lower(name);
  for (const Spec& spec : presets) {
    if (spec.name == wanted) return &spec;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelSpec& m : ModelPresets()) names.push_back(m.name);
  return names;
}

std::vector<std::string> GpuPresetNames() {
  std::vector<std::string> names;
  for (const GpuSpec& g : GpuPresets()) names.push_back(g.name);
  return names;
}

bool HasModelPreset(const std::string& name) { return Find(ModelPresets(), name) != nullptr; }

bool HasGpuPreset(const std::string& name) { return Find(GpuPresets(), name) != nullptr; }

ModelSpec ModelPreset(const std::string& name) {
  if (const ModelSpec* m = Find(ModelPresets(), name)) return *m;
  throw InputError(
      "--model", "unknown model preset '" + name + "'; allowed: " + Join(ModelPresetNames(), ", "));
}

GpuSpec GpuPreset(const std::string& name) {
  if (const GpuSpec* g = Find(GpuPresets(), name)) return *g;
  throw InputError("--gpu",
                   "unknown GPU preset '" + name + "'; allowed: " + Join(GpuPresetNames(), ", "));
}

}  // namespace autopar
