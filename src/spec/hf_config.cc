// Hugging Face `config.json` → ModelSpec.
//
// JSON is YAML flow syntax, so yaml-cpp reads it. Each architecture family has its own key names;
// keys the architecture requires must be present, and the error names the missing key.
#include <string>
#include <vector>

#include "autopar/common/status.h"
#include "autopar/spec/parse.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::Join;
using spec_internal::NodeBool;
using spec_internal::NodeInt;
using spec_internal::NodeString;

constexpr char kDoc[] = "config.json";

// JSON null counts as absent: HF writes `"q_lora_rank": null`, `"n_inner": null`.
bool Has(const YAML::Node& root, const char* key) {
  const YAML::Node node = root[key];
  return node && !node.IsNull();
}

int64_t RequiredInt(const YAML::Node& root, const char* key) {
  if (!Has(root, key)) throw InputError(key, std::string("missing from ") + kDoc);
  return NodeInt(root[key], key);
}

int64_t OptionalInt(const YAML::Node& root, const char* key, int64_t fallback) {
  return Has(root, key) ? NodeInt(root[key], key) : fallback;
}

bool OptionalBool(const YAML::Node& root, const char* key, bool fallback) {
  return Has(root, key) ? NodeBool(root[key], key) : fallback;
}

// The tied/untied default differs per architecture (transformers' per-class config defaults).
void ReadTying(const YAML::Node& root, bool tied_by_default, ModelSpec& m) {
  m.untie_embeddings = !OptionalBool(root, "tie_word_embeddings", tied_by_default);
}

// LlamaForCausalLM and the families that copy its layout (Mistral, Qwen2, Qwen3, Mixtral,
// DeepSeek): gated SiLU MLP, RMSNorm, RoPE, no biases.
ModelSpec FromLlamaLike(const YAML::Node& root) {
  ModelSpec m;
  m.num_layers = RequiredInt(root, "num_hidden_layers");
  m.hidden_size = RequiredInt(root, "hidden_size");
  m.ffn_hidden_size = RequiredInt(root, "intermediate_size");
  m.num_attention_heads = RequiredInt(root, "num_attention_heads");
  m.num_query_groups = OptionalInt(root, "num_key_value_heads", m.num_attention_heads);
  m.vocab_size = RequiredInt(root, "vocab_size");
  m.max_position_embeddings = RequiredInt(root, "max_position_embeddings");
  // The MLP is gated whatever `hidden_act` says (silu, or gelu for GeGLU variants), which is
  // what matters for FLOPs and parameters.
  m.activation = Activation::kSwiGLU;
  m.norm = NormKind::kRMSNorm;
  m.position_embedding = PositionEmbedding::kRope;
  // Qwen2 has QKV biases (`attention_bias` elsewhere); too small to model.
  m.add_bias_linear = false;
  ReadTying(root, /*tied_by_default=*/false, m);
  // An explicit head_dim only matters where it differs from hidden / heads (Qwen3, Gemma-like);
  // keeping 0 otherwise makes equal architectures compare equal.
  if (Has(root, "head_dim") && m.num_attention_heads > 0) {
    const int64_t head_dim = NodeInt(root["head_dim"], "head_dim");
    const bool derived = m.hidden_size % m.num_attention_heads == 0 &&
                         head_dim == m.hidden_size / m.num_attention_heads;
    if (!derived) m.kv_channels = head_dim;
  }
  return m;
}

ModelSpec FromMixtral(const YAML::Node& root) {
  ModelSpec m = FromLlamaLike(root);
  // Mixtral has no dense MLP: intermediate_size is the width of each expert.
  m.num_experts = RequiredInt(root, "num_local_experts");
  m.moe_router_topk = RequiredInt(root, "num_experts_per_tok");
  m.moe_ffn_hidden_size = m.ffn_hidden_size;
  return m;
}

ModelSpec FromDeepseek(const YAML::Node& root) {
  ModelSpec m = FromLlamaLike(root);
  // Multi-head latent attention. A null q_lora_rank (V2-Lite) projects queries directly.
  m.q_lora_rank = OptionalInt(root, "q_lora_rank", 0);
  m.kv_lora_rank = RequiredInt(root, "kv_lora_rank");
  m.qk_head_dim = RequiredInt(root, "qk_nope_head_dim");
  m.qk_pos_emb_head_dim = RequiredInt(root, "qk_rope_head_dim");
  m.v_head_dim = RequiredInt(root, "v_head_dim");
  // Megatron-LM's DeepSeek recipes pass --kv-channels equal to v_head_dim; MLA does not use it.
  m.kv_channels = m.v_head_dim;

  // intermediate_size is the dense MLP of the first_k_dense_replace leading layers.
  m.num_experts = OptionalInt(root, "n_routed_experts", 0);
  if (m.num_experts > 0) {
    m.moe_router_topk = RequiredInt(root, "num_experts_per_tok");
    m.moe_ffn_hidden_size = RequiredInt(root, "moe_intermediate_size");
    m.moe_shared_expert_intermediate_size =
        OptionalInt(root, "n_shared_experts", 0) * m.moe_ffn_hidden_size;
    m.moe_first_dense_layers = OptionalInt(root, "first_k_dense_replace", 0);
    if (OptionalInt(root, "moe_layer_freq", 1) != 1) {
      throw InputError("moe_layer_freq",
                       "only 1 (every layer after first_k_dense_replace is MoE) is supported");
    }
  }
  return m;
}

// GPT-2 and OPT: plain MLP, LayerNorm, learned positions, tied embeddings, biases. The activation
// (gelu_new, relu) only changes elementwise work; kGeLU stands for any non-gated MLP.
ModelSpec GptStyleDefaults() {
  ModelSpec m;
  m.activation = Activation::kGeLU;
  m.norm = NormKind::kLayerNorm;
  m.position_embedding = PositionEmbedding::kLearned;
  m.add_bias_linear = true;
  return m;
}

ModelSpec FromGpt2(const YAML::Node& root) {
  ModelSpec m = GptStyleDefaults();
  m.num_layers = RequiredInt(root, "n_layer");
  m.hidden_size = RequiredInt(root, "n_embd");
  m.num_attention_heads = RequiredInt(root, "n_head");
  m.num_query_groups = m.num_attention_heads;
  m.ffn_hidden_size = OptionalInt(root, "n_inner", 4 * m.hidden_size);
  m.vocab_size = RequiredInt(root, "vocab_size");
  m.max_position_embeddings =
      Has(root, "n_positions") ? RequiredInt(root, "n_positions") : RequiredInt(root, "n_ctx");
  ReadTying(root, /*tied_by_default=*/true, m);
  return m;
}

ModelSpec FromOpt(const YAML::Node& root) {
  ModelSpec m = GptStyleDefaults();
  m.num_layers = RequiredInt(root, "num_hidden_layers");
  m.hidden_size = RequiredInt(root, "hidden_size");
  m.ffn_hidden_size = RequiredInt(root, "ffn_dim");
  m.num_attention_heads = RequiredInt(root, "num_attention_heads");
  m.num_query_groups = m.num_attention_heads;
  m.vocab_size = RequiredInt(root, "vocab_size");
  m.max_position_embeddings = RequiredInt(root, "max_position_embeddings");
  m.add_bias_linear = OptionalBool(root, "enable_bias", true);  // false for Galactica
  ReadTying(root, /*tied_by_default=*/true, m);
  return m;
}

using Reader = ModelSpec (*)(const YAML::Node&);

struct Family {
  const char* architecture;  // `architectures[0]`
  const char* model_type;    // fallback when `architectures` is absent
  Reader read;
};

constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", FromLlamaLike},
    {"MistralForCausalLM", "mistral", FromLlamaLike},
    {"Qwen2ForCausalLM", "qwen2", FromLlamaLike},
    {"Qwen3ForCausalLM", "qwen3", FromLlamaLike},
    {"MixtralForCausalLM", "mixtral", FromMixtral},
    {"DeepseekV2ForCausalLM", "deepseek_v2", FromDeepseek},
    {"DeepseekV3ForCausalLM", "deepseek_v3", FromDeepseek},
    {"GPT2LMHeadModel", "gpt2", FromGpt2},
    {"OPTForCausalLM", "opt", FromOpt},
};

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const Family& f : kFamilies) names.push_back(f.architecture);
  return names;
}

const Family& FindFamily(const YAML::Node& root) {
  if (Has(root, "architectures")) {
    const YAML::Node list = root["architectures"];
    if (!list.IsSequence() || list.size() == 0) {
      throw InputError("architectures", "expected a non-empty list of class names");
    }
    const std::string arch = NodeString(list[0], "architectures");
    for (const Family& f : kFamilies) {
      if (arch == f.architecture) return f;
    }
    throw InputError("architectures", "unsupported architecture '" + arch +
                                          "'; supported: " + Join(SupportedArchitectures(), ", "));
  }
  if (Has(root, "model_type")) {
    const std::string type = NodeString(root["model_type"], "model_type");
    for (const Family& f : kFamilies) {
      if (type == f.model_type) return f;
    }
    throw InputError("model_type",
                     "unsupported model_type '" + type +
                         "'; supported architectures: " + Join(SupportedArchitectures(), ", "));
  }
  throw InputError("architectures",
                   std::string("missing from ") + kDoc +
                       " (and no model_type); supported: " + Join(SupportedArchitectures(), ", "));
}

}  // namespace

ModelSpec ModelFromHfConfig(const std::string& json_text) {
  const YAML::Node root = spec_internal::LoadMapping(json_text, kDoc);
  ModelSpec m = FindFamily(root).read(root);
  if (Has(root, "_name_or_path") && !NodeString(root["_name_or_path"], "_name_or_path").empty()) {
    m.name = NodeString(root["_name_or_path"], "_name_or_path");
  } else if (Has(root, "model_type")) {
    m.name = NodeString(root["model_type"], "model_type");
  } else {
    m.name = "hf-model";
  }
  Validate(m);
  return m;
}

}  // namespace autopar
