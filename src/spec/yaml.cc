// Model, GPU and cluster descriptions written by hand in YAML.
//
// Model keys are ModelSpec field names in Megatron-LM's spelling, so a YAML file and a pasted
// command line describe a model with the same words. GPU keys are in the units datasheets use
// (GB/s, TFLOP/s, microseconds) and converted to SI here.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "autopar/spec/units.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::Join;
using spec_internal::LoadMapping;
using spec_internal::NodeBool;
using spec_internal::NodeDouble;
using spec_internal::NodeInt;
using spec_internal::NodeString;

constexpr char kModelDoc[] = "model YAML";
constexpr char kGpuDoc[] = "GPU YAML";
constexpr char kClusterDoc[] = "cluster YAML";

struct IntKey {
  const char* key;
  int64_t ModelSpec::*member;
};

// Keys whose YAML name is the ModelSpec field name (and Megatron-LM's argument name).
constexpr IntKey kModelIntKeys[] = {
    {"num_layers", &ModelSpec::num_layers},
    {"hidden_size", &ModelSpec::hidden_size},
    {"ffn_hidden_size", &ModelSpec::ffn_hidden_size},
    {"num_attention_heads", &ModelSpec::num_attention_heads},
    {"num_query_groups", &ModelSpec::num_query_groups},
    {"kv_channels", &ModelSpec::kv_channels},
    {"vocab_size", &ModelSpec::vocab_size},
    {"max_position_embeddings", &ModelSpec::max_position_embeddings},
    {"q_lora_rank", &ModelSpec::q_lora_rank},
    {"kv_lora_rank", &ModelSpec::kv_lora_rank},
    {"qk_head_dim", &ModelSpec::qk_head_dim},
    {"qk_pos_emb_head_dim", &ModelSpec::qk_pos_emb_head_dim},
    {"v_head_dim", &ModelSpec::v_head_dim},
    {"num_experts", &ModelSpec::num_experts},
    {"moe_router_topk", &ModelSpec::moe_router_topk},
    {"moe_ffn_hidden_size", &ModelSpec::moe_ffn_hidden_size},
    {"moe_shared_expert_intermediate_size", &ModelSpec::moe_shared_expert_intermediate_size},
    {"moe_first_dense_layers", &ModelSpec::moe_first_dense_layers},
    {"window_size", &ModelSpec::window_size},
    {"window_attn_skip_freq", &ModelSpec::window_attn_skip_freq},
    {"mtp_num_layers", &ModelSpec::mtp_num_layers},
};

// Keys with a meaning of their own. The struct's spellings (`norm`, `position_embedding`,
// `untie_embeddings`) are accepted next to Megatron's so a printed spec reads back.
const std::vector<std::string>& ModelOtherKeys() {
  static const std::vector<std::string> keys = {"base",
                                                "name",
                                                "activation",
                                                "swiglu",
                                                "normalization",
                                                "norm",
                                                "position_embedding_type",
                                                "position_embedding",
                                                "untie_embeddings_and_output_weights",
                                                "untie_embeddings",
                                                "add_bias_linear",
                                                "disable_bias_linear",
                                                "qk_layernorm"};
  return keys;
}

std::vector<std::string> KnownModelKeys() {
  std::vector<std::string> keys = ModelOtherKeys();
  for (const IntKey& k : kModelIntKeys) keys.push_back(k.key);
  return keys;
}

// Applies one non-integer key; returns false when the key is unknown.
bool ApplyModelKey(const std::string& key, const YAML::Node& value, ModelSpec& m) {
  if (key == "base") return true;  // applied before every other key
  if (key == "name") {
    m.name = NodeString(value, key);
  } else if (key == "activation") {
    m.activation = spec_internal::ParseActivation(NodeString(value, key), key);
  } else if (key == "swiglu") {
    m.activation = NodeBool(value, key) ? Activation::kSwiGLU : Activation::kGeLU;
  } else if (key == "normalization" || key == "norm") {
    m.norm = spec_internal::ParseNorm(NodeString(value, key), key);
  } else if (key == "position_embedding_type" || key == "position_embedding") {
    m.position_embedding = spec_internal::ParsePositionEmbedding(NodeString(value, key), key);
  } else if (key == "untie_embeddings_and_output_weights" || key == "untie_embeddings") {
    m.untie_embeddings = NodeBool(value, key);
  } else if (key == "add_bias_linear") {
    m.add_bias_linear = NodeBool(value, key);
  } else if (key == "disable_bias_linear") {
    m.add_bias_linear = !NodeBool(value, key);
  } else if (key == "qk_layernorm") {
    m.qk_layernorm = NodeBool(value, key);
  } else {
    return false;
  }
  return true;
}

// A GPU key in human units and the GpuSpec field it sets (value x scale).
struct GpuKey {
  const char* key;
  double GpuSpec::*member;
  double scale;
  const char* field;  // the name Validate(GpuSpec) uses
};

constexpr double kGiBPerGB = 1e9 / kGiB;

constexpr GpuKey kGpuKeys[] = {
    {"memory_gib", &GpuSpec::memory_gib, 1.0, "memory_gib"},
    {"memory_gb", &GpuSpec::memory_gib, kGiBPerGB, "memory_gib"},
    {"peak_tflops_bf16", &GpuSpec::peak_flops_bf16, 1e12, "peak_flops_bf16"},
    {"peak_tflops_fp16", &GpuSpec::peak_flops_fp16, 1e12, "peak_flops_fp16"},
    {"peak_tflops_fp8", &GpuSpec::peak_flops_fp8, 1e12, "peak_flops_fp8"},
    {"peak_tflops_fp32", &GpuSpec::peak_flops_fp32, 1e12, "peak_flops_fp32"},
    {"hbm_bandwidth_gbps", &GpuSpec::hbm_bandwidth, 1e9, "hbm_bandwidth"},
    {"intra_node_bandwidth_gbps", &GpuSpec::intra_node_bandwidth, 1e9, "intra_node_bandwidth"},
    {"inter_node_bandwidth_gbps", &GpuSpec::inter_node_bandwidth, 1e9, "inter_node_bandwidth"},
    {"intra_node_latency_us", &GpuSpec::intra_node_latency_s, 1e-6, "intra_node_latency_s"},
    {"inter_node_latency_us", &GpuSpec::inter_node_latency_s, 1e-6, "inter_node_latency_s"},
};

std::vector<std::string> KnownGpuKeys() {
  std::vector<std::string> keys = {"base", "name", "source", "nvlink_domain_gpus"};
  for (const GpuKey& k : kGpuKeys) keys.push_back(k.key);
  return keys;
}

// The YAML key a user wrote for a GpuSpec field, so errors name what is in their file.
std::string GpuKeyForField(const std::string& field) {
  for (const GpuKey& k : kGpuKeys) {
    if (field == k.field) return k.key;
  }
  return field;
}

GpuSpec GpuFromNode(const YAML::Node& root, const std::string& prefix) {
  GpuSpec g;
  std::string base;
  if (const YAML::Node node = root["base"]) {
    base = NodeString(node, prefix + "base");
    try {
      g = GpuPreset(base);
    } catch (const InputError& e) {
      throw spec_internal::Rename(e, prefix + "base");
    }
  } else {
    g.name = "custom";
  }

  bool overridden = false;
  for (const auto& entry : root) {
    const std::string key = NodeString(entry.first, prefix + "<key>");
    const std::string field = prefix + key;
    if (key == "base") continue;
    if (key == "name") {
      g.name = NodeString(entry.second, field);
      continue;
    }
    if (key == "source") {
      g.source = NodeString(entry.second, field);
      continue;
    }
    if (key == "nvlink_domain_gpus") {
      g.nvlink_domain_gpus = NodeInt(entry.second, field);
      if (g.nvlink_domain_gpus <= 0) {
        throw InputError(field,
                         "must be a positive number of GPUs, a whole number of nodes (72 "
                         "for an NVL72 rack), got " +
                             std::to_string(g.nvlink_domain_gpus));
      }
      overridden = true;
      continue;
    }
    const GpuKey* spec_key = nullptr;
    for (const GpuKey& k : kGpuKeys) {
      if (key == k.key) spec_key = &k;
    }
    if (spec_key == nullptr) {
      throw InputError(field, "unknown key in " + std::string(kGpuDoc) +
                                  "; known keys: " + Join(KnownGpuKeys(), ", "));
    }
    const double value = NodeDouble(entry.second, field);
    if (value < 0) throw InputError(field, "must not be negative");
    g.*(spec_key->member) = value * spec_key->scale;
    overridden = true;
  }

  // Every current GPU runs fp16 and bf16 at the same rate; a file that gives one means both.
  if (g.peak_flops_fp16 == 0) g.peak_flops_fp16 = g.peak_flops_bf16;
  if (g.peak_flops_bf16 == 0) g.peak_flops_bf16 = g.peak_flops_fp16;
  if (overridden && !root["source"]) {
    g.source =
        base.empty() ? "user YAML" : "user YAML over preset '" + base + "' (" + g.source + ")";
  }

  try {
    Validate(g);
  } catch (const InputError& e) {
    // Validate's message (in GpuSpec's units) under the key the file spells.
    const std::string key = prefix + GpuKeyForField(e.field());
    const std::string what = e.what();
    const std::string message = what.substr(std::min(what.size(), e.field().size() + 2));
    throw InputError(key, message + " (give it, or start from `base:` with one of: " +
                              Join(GpuPresetNames(), ", ") + ")");
  }
  return g;
}

}  // namespace

ModelSpec ModelFromYaml(const std::string& text) {
  const YAML::Node root = LoadMapping(text, kModelDoc);
  ModelSpec m;
  if (const YAML::Node base = root["base"]) {
    const std::string name = NodeString(base, "base");
    try {
      m = ModelPreset(name);
    } catch (const InputError& e) {
      throw spec_internal::Rename(e, "base");
    }
  } else {
    m.name = "custom";
  }

  for (const auto& entry : root) {
    const std::string key = NodeString(entry.first, "<key>");
    bool known = false;
    for (const IntKey& k : kModelIntKeys) {
      if (key == k.key) {
        m.*(k.member) = NodeInt(entry.second, key);
        known = true;
      }
    }
    if (!known && !ApplyModelKey(key, entry.second, m)) {
      throw InputError(key, "unknown key in " + std::string(kModelDoc) +
                                "; known keys: " + Join(KnownModelKeys(), ", "));
    }
  }

  // No GQA unless asked for: one key/value head per query head.
  if (m.num_query_groups == 0) m.num_query_groups = m.num_attention_heads;
  Validate(m);
  return m;
}

GpuSpec GpuFromYaml(const std::string& text) { return GpuFromNode(LoadMapping(text, kGpuDoc), ""); }

// Fields the file leaves out stay zero: the CLI fills them from flags (--nnodes,
// --nproc-per-node, --gpu) and then calls Validate(ClusterSpec).
ClusterSpec ClusterFromYaml(const std::string& text) {
  const YAML::Node root = LoadMapping(text, kClusterDoc);
  ClusterSpec c;
  for (const auto& entry : root) {
    const std::string key = NodeString(entry.first, "<key>");
    if (key == "nnodes" || key == "gpus_per_node" || key == "nproc_per_node") {
      const int64_t value = NodeInt(entry.second, key);
      if (value <= 0) {
        throw InputError(key, "must be a positive integer, got " + std::to_string(value));
      }
      (key == "nnodes" ? c.nnodes : c.gpus_per_node) = value;
    } else if (key == "gpu") {
      if (entry.second.IsMap()) {
        c.gpu = GpuFromNode(entry.second, "gpu.");
      } else {
        try {
          c.gpu = GpuPreset(NodeString(entry.second, key));
        } catch (const InputError& e) {
          throw spec_internal::Rename(e, "gpu");
        }
      }
    } else if (key == "nvlink_domain_gpus") {
      throw InputError(key,
                       "is a property of the GPU's system: give it in the GPU map, e.g. "
                       "`gpu: {base: gb200, nvlink_domain_gpus: 36}`");
    } else {
      throw InputError(key, "unknown key in " + std::string(kClusterDoc) +
                                "; known keys: nnodes, gpus_per_node (or nproc_per_node), gpu");
    }
  }
  // What the file alone can tell: a domain that is not whole nodes of the file's own size.
  const int64_t domain = c.gpu.nvlink_domain_gpus;
  if (c.gpus_per_node > 0 && domain > 0 && domain % c.gpus_per_node != 0) {
    const bool in_map = root["gpu"].IsMap() && root["gpu"]["nvlink_domain_gpus"];
    throw InputError(
        in_map ? "gpu.nvlink_domain_gpus" : "gpus_per_node",
        "an NVLink domain is whole nodes: nvlink_domain_gpus=" + std::to_string(domain) +
            " (GPU '" + c.gpu.name +
            "') is not a multiple of gpus_per_node=" + std::to_string(c.gpus_per_node));
  }
  return c;
}

}  // namespace autopar
