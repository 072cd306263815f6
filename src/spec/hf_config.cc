// Hugging Face `config.json` → ModelSpec.
//
// JSON is YAML flow syntax, so yaml-cpp reads it. Each architecture family has its own key names;
// keys the architecture requires must be present, and the error names the missing key. A key that
// looks like a mixture-of-experts or multi-token-prediction setting but that the family's reader
// never looked at is an error: importing without it would model a smaller, dense network
// (docs/models.md §9).
#include <set>
#include <string>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::Join;
using spec_internal::Lower;
using spec_internal::NodeBool;
using spec_internal::NodeInt;
using spec_internal::NodeString;

constexpr char kDoc[] = "config.json";

// A config.json being read, with the top-level keys its reader has looked at.
class Config {
 public:
  explicit Config(const YAML::Node& root) : root_(root) {}

  // JSON null counts as absent: HF writes `"q_lora_rank": null`, `"n_inner": null`.
  bool Has(const char* key) {
    read_.insert(key);
    const YAML::Node node = root_[key];
    return node && !node.IsNull();
  }
  YAML::Node Node(const char* key) {
    read_.insert(key);
    return root_[key];
  }
  int64_t Int(const char* key) {
    if (!Has(key)) throw InputError(key, std::string("missing from ") + kDoc);
    return NodeInt(root_[key], key);
  }
  int64_t Int(const char* key, int64_t fallback) {
    return Has(key) ? NodeInt(root_[key], key) : fallback;
  }
  bool Bool(const char* key, bool fallback) {
    return Has(key) ? NodeBool(root_[key], key) : fallback;
  }
  const YAML::Node& root() const { return root_; }
  bool WasRead(const std::string& key) const { return read_.count(key) > 0; }

 private:
  YAML::Node root_;
  std::set<std::string> read_;
};

// The routed experts of a mixture-of-experts architecture: at least one (none would import a
// dense model under a MoE family's name), at most the bound on experts.
int64_t Experts(Config& cfg, const char* key) {
  const int64_t experts = cfg.Int(key);
  if (experts < 1 || experts > spec_internal::kMaxExperts) {
    throw InputError(key, "a mixture-of-experts architecture needs 1 to " +
                              std::to_string(spec_internal::kMaxExperts) + " experts, got " +
                              std::to_string(experts));
  }
  return experts;
}

// The tied/untied default differs per architecture (transformers' per-class config defaults).
void ReadTying(Config& cfg, bool tied_by_default, ModelSpec& m) {
  m.untie_embeddings = !cfg.Bool("tie_word_embeddings", tied_by_default);
}

// ---- sliding windows ----

// `layer_types` (transformers ≥ 4.53 writes it for hybrid models): "sliding_attention" or
// "full_attention" per layer. Returns Megatron's --window-attn-skip-freq for it: 0 when every
// layer slides, N when exactly the layers N, 2N, ... (1-based) are full, -1 when none slides.
int64_t SkipFreqOfLayerTypes(Config& cfg, int64_t num_layers) {
  const YAML::Node list = cfg.Node("layer_types");
  if (!list.IsSequence() || static_cast<int64_t>(list.size()) != num_layers) {
    throw InputError("layer_types", "expected a list of num_hidden_layers (" +
                                        std::to_string(num_layers) +
                                        ") entries sliding_attention|full_attention");
  }
  std::vector<bool> full;
  for (const YAML::Node& item : list) {
    const std::string type = NodeString(item, "layer_types");
    if (type != "sliding_attention" && type != "full_attention") {
      throw InputError("layer_types", "unknown layer type '" + type +
                                          "'; allowed: sliding_attention|full_attention");
    }
    full.push_back(type == "full_attention");
  }
  int64_t first_full = 0;
  while (first_full < num_layers && !full[first_full]) ++first_full;
  if (first_full == num_layers) return 0;
  const int64_t freq = first_full + 1;
  for (int64_t i = 0; i < num_layers; ++i) {
    if (full[i] != ((i + 1) % freq == 0)) {
      throw InputError("layer_types",
                       "only a pattern where every N-th layer is full_attention (Megatron-LM's "
                       "--window-attn-skip-freq N) is modelled; layer " +
                           std::to_string(i) + " breaks the period " + std::to_string(freq));
    }
  }
  return freq == 1 ? -1 : freq;  // every layer full
}

// `sliding_window` with the family's layer pattern: `layer_types` when given, else the family's
// fixed period (0: every layer slides). A null window means full attention everywhere.
void ReadSlidingWindow(Config& cfg, int64_t default_skip_freq, ModelSpec& m) {
  m.window_size = cfg.Int("sliding_window", 0);
  int64_t freq = default_skip_freq;
  if (cfg.Has("layer_types")) freq = SkipFreqOfLayerTypes(cfg, m.num_layers);
  if (m.window_size <= 0 || freq < 0) {
    m.window_size = 0;
    freq = 0;
  }
  m.window_attn_skip_freq = freq;
}

// Qwen2/Qwen3(-MoE): the window applies only with `use_sliding_window`, and then to the layers
// from `max_window_layers` on (transformers' Qwen2Config).
void ReadQwenWindow(Config& cfg, ModelSpec& m) {
  const bool use = cfg.Bool("use_sliding_window", false);
  const int64_t window = cfg.Int("sliding_window", 0);
  if (!use || window <= 0) return;
  const int64_t full_layers = cfg.Int("max_window_layers", m.num_layers);
  if (full_layers >= m.num_layers) return;
  if (full_layers > 0) {
    throw InputError("max_window_layers",
                     "full attention in the first " + std::to_string(full_layers) +
                         " layers and a window after them cannot be modelled; allowed: 0 or at "
                         "least num_hidden_layers (" +
                         std::to_string(m.num_layers) + ")");
  }
  m.window_size = window;
}

// ---- families ----

// LlamaForCausalLM and the families that copy its layout (Mistral, Qwen2, Qwen3, Mixtral,
// DeepSeek, Phi-3, Gemma): gated MLP, RMSNorm, RoPE, no biases.
ModelSpec FromLlamaLike(Config& cfg) {
  ModelSpec m;
  m.num_layers = cfg.Int("num_hidden_layers");
  m.hidden_size = cfg.Int("hidden_size");
  m.ffn_hidden_size = cfg.Int("intermediate_size");
  m.num_attention_heads = cfg.Int("num_attention_heads");
  m.num_query_groups = cfg.Int("num_key_value_heads", m.num_attention_heads);
  m.vocab_size = cfg.Int("vocab_size");
  m.max_position_embeddings = cfg.Int("max_position_embeddings");
  // The MLP is gated whatever `hidden_act` says (silu, or gelu for GeGLU variants), which is
  // what matters for FLOPs and parameters.
  m.activation = Activation::kSwiGLU;
  m.norm = NormKind::kRMSNorm;
  m.position_embedding = PositionEmbedding::kRope;
  // Qwen2 has QKV biases (`attention_bias` elsewhere); too small to model.
  m.add_bias_linear = false;
  ReadTying(cfg, /*tied_by_default=*/false, m);
  // An explicit head_dim only matters where it differs from hidden / heads (Qwen3, Gemma-like);
  // keeping 0 otherwise makes equal architectures compare equal.
  if (cfg.Has("head_dim") && m.num_attention_heads > 0) {
    const int64_t head_dim = cfg.Int("head_dim");
    const bool derived = m.hidden_size % m.num_attention_heads == 0 &&
                         head_dim == m.hidden_size / m.num_attention_heads;
    if (!derived) m.kv_channels = head_dim;
  }
  return m;
}

// Mistral and Phi-3 (whose fused qkv_proj and gate_up_proj hold the same weights as Llama's
// separate ones): a window on every layer when `sliding_window` is set.
ModelSpec FromMistralLike(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  ReadSlidingWindow(cfg, /*default_skip_freq=*/0, m);
  return m;
}

ModelSpec FromQwen(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  ReadQwenWindow(cfg, m);
  return m;
}

// Qwen3 normalizes each query and key head (q_norm, k_norm: RMSNorm over head_dim), Megatron-core's
// --qk-layernorm.
ModelSpec FromQwen3(Config& cfg) {
  ModelSpec m = FromQwen(cfg);
  m.qk_layernorm = true;
  return m;
}

ModelSpec FromMixtral(Config& cfg) {
  ModelSpec m = FromMistralLike(cfg);
  // Mixtral has no dense MLP: intermediate_size is the width of each expert.
  m.num_experts = Experts(cfg, "num_local_experts");
  m.moe_router_topk = cfg.Int("num_experts_per_tok");
  m.moe_ffn_hidden_size = m.ffn_hidden_size;
  return m;
}

// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): routed experts only, `intermediate_size` is the
// dense MLP of the layers listed in `mlp_only_layers`, which must be leading ones.
ModelSpec FromQwen3Moe(Config& cfg) {
  ModelSpec m = FromQwen3(cfg);
  m.num_experts = Experts(cfg, "num_experts");
  m.moe_router_topk = cfg.Int("num_experts_per_tok");
  m.moe_ffn_hidden_size = cfg.Int("moe_intermediate_size");
  if (cfg.Int("decoder_sparse_step", 1) != 1) {
    throw InputError("decoder_sparse_step",
                     "only 1 (every layer not in mlp_only_layers is MoE) is supported");
  }
  if (cfg.Has("mlp_only_layers")) {
    const YAML::Node list = cfg.Node("mlp_only_layers");
    if (!list.IsSequence()) throw InputError("mlp_only_layers", "expected a list of layer indices");
    for (size_t i = 0; i < list.size(); ++i) {
      if (NodeInt(list[i], "mlp_only_layers") != static_cast<int64_t>(i)) {
        throw InputError("mlp_only_layers",
                         "only leading dense layers [0, 1, ..., k-1] can be modelled");
      }
    }
    m.moe_first_dense_layers = static_cast<int64_t>(list.size());
  }
  return m;
}

// gpt-oss: MoE on every layer with biases on every linear layer (attention and experts), a
// 128-token window on every other layer (the first slides), per-head attention sinks (a few
// thousand parameters, not modelled).
ModelSpec FromGptOss(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  m.add_bias_linear = true;
  m.num_experts = Experts(cfg, "num_local_experts");
  const bool old_key = cfg.Has("experts_per_token"), new_key = cfg.Has("num_experts_per_tok");
  if (!old_key && !new_key) {
    throw InputError("num_experts_per_tok",
                     std::string("missing from ") + kDoc + " (nor experts_per_token)");
  }
  m.moe_router_topk = new_key ? cfg.Int("num_experts_per_tok") : cfg.Int("experts_per_token");
  if (old_key && new_key && cfg.Int("experts_per_token") != m.moe_router_topk) {
    throw InputError("experts_per_token", "disagrees with num_experts_per_tok (" +
                                              std::to_string(m.moe_router_topk) + ")");
  }
  m.moe_ffn_hidden_size = m.ffn_hidden_size;
  ReadSlidingWindow(cfg, /*default_skip_freq=*/2, m);
  return m;
}

// Gemma-2 and Gemma-3 (text): GeGLU MLP, an explicit head_dim, tied embeddings over a 256k
// vocabulary, and local (windowed) layers between global ones: Gemma-2 alternates starting with
// a local layer, Gemma-3 has `sliding_window_pattern` − 1 local layers before each global one.
// Their extra norms around attention and MLP are a few hidden-sized vectors, not modelled;
// Gemma-3's query and key norms (q_norm, k_norm over head_dim) are Megatron-core's --qk-layernorm.
ModelSpec FromGemma2(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  ReadTying(cfg, /*tied_by_default=*/true, m);
  ReadSlidingWindow(cfg, /*default_skip_freq=*/2, m);
  return m;
}

ModelSpec FromGemma3(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  m.qk_layernorm = true;
  ReadTying(cfg, /*tied_by_default=*/true, m);
  const int64_t pattern = cfg.Int("sliding_window_pattern", 6);
  if (pattern < 1) {
    throw InputError("sliding_window_pattern",
                     "must be a positive integer, got " + std::to_string(pattern));
  }
  // A pattern of 1 makes every layer global.
  ReadSlidingWindow(cfg, pattern == 1 ? -1 : pattern, m);
  return m;
}

ModelSpec FromDeepseek(Config& cfg) {
  ModelSpec m = FromLlamaLike(cfg);
  // Multi-head latent attention. A null q_lora_rank (V2-Lite) projects queries directly.
  m.q_lora_rank = cfg.Int("q_lora_rank", 0);
  m.kv_lora_rank = cfg.Int("kv_lora_rank");
  m.qk_head_dim = cfg.Int("qk_nope_head_dim");
  m.qk_pos_emb_head_dim = cfg.Int("qk_rope_head_dim");
  m.v_head_dim = cfg.Int("v_head_dim");
  // q_a_layernorm and kv_a_layernorm: Megatron-core's MLA builds them under --qk-layernorm.
  m.qk_layernorm = true;
  // Megatron-LM's DeepSeek recipes pass --kv-channels equal to v_head_dim; MLA does not use it.
  m.kv_channels = m.v_head_dim;
  // DeepSeek-V3's multi-token-prediction modules (Megatron-LM's --mtp-num-layers).
  m.mtp_num_layers = cfg.Int("num_nextn_predict_layers", 0);

  // intermediate_size is the dense MLP of the first_k_dense_replace leading layers.
  m.num_experts = cfg.Int("n_routed_experts", 0);
  if (m.num_experts > 0) {
    m.moe_router_topk = cfg.Int("num_experts_per_tok");
    m.moe_ffn_hidden_size = cfg.Int("moe_intermediate_size");
    const int64_t shared = cfg.Int("n_shared_experts", 0);
    if (shared < 0 || shared > spec_internal::kMaxExperts) {
      throw InputError("n_shared_experts", "must be 0 to " +
                                               std::to_string(spec_internal::kMaxExperts) +
                                               ", got " + std::to_string(shared));
    }
    spec_internal::RequireAtMost(m.moe_ffn_hidden_size, spec_internal::kMaxFfn,
                                 "moe_intermediate_size");
    m.moe_shared_expert_intermediate_size = shared * m.moe_ffn_hidden_size;
    m.moe_first_dense_layers = cfg.Int("first_k_dense_replace", 0);
    if (cfg.Int("moe_layer_freq", 1) != 1) {
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

ModelSpec FromGpt2(Config& cfg) {
  ModelSpec m = GptStyleDefaults();
  m.num_layers = cfg.Int("n_layer");
  m.hidden_size = cfg.Int("n_embd");
  m.num_attention_heads = cfg.Int("n_head");
  m.num_query_groups = m.num_attention_heads;
  spec_internal::RequireAtMost(m.hidden_size, spec_internal::kMaxWidth, "n_embd");  // before 4·
  m.ffn_hidden_size = cfg.Int("n_inner", 4 * m.hidden_size);
  m.vocab_size = cfg.Int("vocab_size");
  m.max_position_embeddings = cfg.Has("n_positions") ? cfg.Int("n_positions") : cfg.Int("n_ctx");
  ReadTying(cfg, /*tied_by_default=*/true, m);
  return m;
}

ModelSpec FromOpt(Config& cfg) {
  ModelSpec m = GptStyleDefaults();
  m.num_layers = cfg.Int("num_hidden_layers");
  m.hidden_size = cfg.Int("hidden_size");
  m.ffn_hidden_size = cfg.Int("ffn_dim");
  m.num_attention_heads = cfg.Int("num_attention_heads");
  m.num_query_groups = m.num_attention_heads;
  m.vocab_size = cfg.Int("vocab_size");
  m.max_position_embeddings = cfg.Int("max_position_embeddings");
  m.add_bias_linear = cfg.Bool("enable_bias", true);  // false for Galactica
  ReadTying(cfg, /*tied_by_default=*/true, m);
  return m;
}

using Reader = ModelSpec (*)(Config&);

struct Family {
  const char* architecture;  // `architectures[0]`
  const char* model_type;    // fallback when `architectures` is absent
  Reader read;
};

constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", FromLlamaLike},
    {"MistralForCausalLM", "mistral", FromMistralLike},
    {"Qwen2ForCausalLM", "qwen2", FromQwen},
    {"Qwen3ForCausalLM", "qwen3", FromQwen3},
    {"Qwen3MoeForCausalLM", "qwen3_moe", FromQwen3Moe},
    {"MixtralForCausalLM", "mixtral", FromMixtral},
    {"GptOssForCausalLM", "gpt_oss", FromGptOss},
    {"Gemma2ForCausalLM", "gemma2", FromGemma2},
    {"Gemma3ForCausalLM", "gemma3_text", FromGemma3},
    {"Phi3ForCausalLM", "phi3", FromMistralLike},
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

const Family& FindFamily(Config& cfg) {
  if (cfg.Has("architectures")) {
    const YAML::Node list = cfg.Node("architectures");
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
  if (cfg.Has("model_type")) {
    const std::string type = NodeString(cfg.Node("model_type"), "model_type");
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

// Keys that size experts or prediction modules: dropping one imports a smaller model.
bool LooksLikeMoeOrMtp(const std::string& key) {
  const std::string lower = Lower(key);
  for (const char* part : {"expert", "moe", "nextn", "mtp"}) {
    if (lower.find(part) != std::string::npos) return true;
  }
  return false;
}

// Such keys that some family above reads. An unread key outside this list (a misspelling) is
// named first, since the others are often left unread because of it.
constexpr const char* kKnownMoeKeys[] = {
    "num_local_experts",     "num_experts",      "num_experts_per_tok",
    "experts_per_token",     "n_routed_experts", "n_shared_experts",
    "moe_intermediate_size", "moe_layer_freq",   "num_nextn_predict_layers"};

bool IsKnownMoeKey(const std::string& key) {
  for (const char* known : kKnownMoeKeys) {
    if (key == known) return true;
  }
  return false;
}

void RejectUnreadMoeKeys(const Config& cfg, const Family& family) {
  std::vector<std::string> understood, unknown, unread;
  for (const auto& entry : cfg.root()) {
    // JSON keys are strings; YAML (which reads the file) also takes a list or map as a key.
    if (!entry.first.IsScalar()) {
      throw InputError(kDoc, "every key must be a string; one is a list or a map");
    }
    const std::string key = entry.first.as<std::string>();
    if (!LooksLikeMoeOrMtp(key)) continue;
    if (cfg.WasRead(key)) {
      understood.push_back(key);
    } else {
      (IsKnownMoeKey(key) ? unread : unknown).push_back(key);
    }
  }
  unknown.insert(unknown.end(), unread.begin(), unread.end());
  if (unknown.empty()) return;
  throw InputError(unknown.front(),
                   "looks like a mixture-of-experts or multi-token-prediction setting, but " +
                       std::string(family.architecture) + " does not read it (unread: " +
                       Join(unknown, ", ") + "; the keys of that kind it read: " +
                       (understood.empty() ? "none" : Join(understood, ", ")) +
                       "); a misspelt or unsupported key would silently import a smaller model");
}

}  // namespace

ModelSpec ModelFromHfConfig(const std::string& json_text) {
  Config cfg(spec_internal::LoadMapping(json_text, kDoc));
  const Family& family = FindFamily(cfg);
  ModelSpec m = family.read(cfg);
  RejectUnreadMoeKeys(cfg, family);
  if (cfg.Has("_name_or_path") && !NodeString(cfg.Node("_name_or_path"), "_name_or_path").empty()) {
    m.name = NodeString(cfg.Node("_name_or_path"), "_name_or_path");
  } else if (cfg.Has("model_type")) {
    m.name = NodeString(cfg.Node("model_type"), "model_type");
  } else {
    m.name = "hf-model";
  }
  Validate(m);
  return m;
}

}  // namespace autopar
