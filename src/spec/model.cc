#include "autopar/spec/model.h"

#include <string>

#include "autopar/common/errors.h"
#include "internal.h"

namespace autopar {

const char* ToString(Activation a) {
  switch (a) {
    case Activation::kSwiGLU:
      return "swiglu";
    case Activation::kGeLU:
      return "gelu";
  }
  return "unknown";
}

// Megatron-LM's spellings (`--normalization RMSNorm`, `--position-embedding-type rope`), so a
// printed spec can be pasted back as flags.
const char* ToString(NormKind n) {
  switch (n) {
    case NormKind::kRMSNorm:
      return "RMSNorm";
    case NormKind::kLayerNorm:
      return "LayerNorm";
  }
  return "unknown";
}

const char* ToString(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kRope:
      return "rope";
    case PositionEmbedding::kLearned:
      return "learned_absolute";
  }
  return "unknown";
}

namespace spec_internal {

Activation ParseActivation(std::string_view text, const std::string& field) {
  const std::string lower = Lower(text);
  if (lower == "swiglu") return Activation::kSwiGLU;
  if (lower == "gelu") return Activation::kGeLU;
  throw InputError(field, "unknown activation '" + std::string(text) + "'; allowed: swiglu|gelu");
}

NormKind ParseNorm(std::string_view text, const std::string& field) {
  const std::string lower = Lower(text);
  if (lower == "rmsnorm") return NormKind::kRMSNorm;
  if (lower == "layernorm") return NormKind::kLayerNorm;
  throw InputError(field,
                   "unknown normalization '" + std::string(text) + "'; allowed: RMSNorm|LayerNorm");
}

PositionEmbedding ParsePositionEmbedding(std::string_view text, const std::string& field) {
  const std::string lower = Lower(text);
  if (lower == "rope") return PositionEmbedding::kRope;
  if (lower == "learned_absolute") return PositionEmbedding::kLearned;
  throw InputError(field, "unsupported position embedding '" + std::string(text) +
                              "'; allowed: rope|learned_absolute");
}

}  // namespace spec_internal

namespace {

void RequirePositive(int64_t value, const char* field) {
  if (value <= 0) {
    throw InputError(field, "must be a positive integer, got " + std::to_string(value));
  }
}

void RequireNonNegative(int64_t value, const char* field) {
  if (value < 0) {
    throw InputError(field, "must not be negative, got " + std::to_string(value));
  }
}

}  // namespace

int64_t ModelSpec::num_windowed_layers(int64_t first, int64_t count) const {
  if (window_size <= 0 || count <= 0) return 0;
  if (window_attn_skip_freq <= 0) return count;
  // Full layers among 1-based numbers (first, first + count]: multiples of the frequency.
  const int64_t full = (first + count) / window_attn_skip_freq - first / window_attn_skip_freq;
  return count - full;
}

void Validate(const ModelSpec& m) {
  RequirePositive(m.num_layers, "num_layers");
  RequirePositive(m.hidden_size, "hidden_size");
  RequirePositive(m.ffn_hidden_size, "ffn_hidden_size");
  RequirePositive(m.num_attention_heads, "num_attention_heads");
  RequirePositive(m.num_query_groups, "num_query_groups");
  RequirePositive(m.vocab_size, "vocab_size");
  RequireNonNegative(m.kv_channels, "kv_channels");
  RequireNonNegative(m.max_position_embeddings, "max_position_embeddings");
  RequireNonNegative(m.q_lora_rank, "q_lora_rank");
  RequireNonNegative(m.kv_lora_rank, "kv_lora_rank");
  RequireNonNegative(m.qk_head_dim, "qk_head_dim");
  RequireNonNegative(m.qk_pos_emb_head_dim, "qk_pos_emb_head_dim");
  RequireNonNegative(m.v_head_dim, "v_head_dim");
  RequireNonNegative(m.num_experts, "num_experts");
  RequireNonNegative(m.moe_router_topk, "moe_router_topk");
  RequireNonNegative(m.moe_ffn_hidden_size, "moe_ffn_hidden_size");
  RequireNonNegative(m.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size");
  RequireNonNegative(m.moe_first_dense_layers, "moe_first_dense_layers");
  RequireNonNegative(m.window_size, "window_size");
  RequireNonNegative(m.window_attn_skip_freq, "window_attn_skip_freq");
  RequireNonNegative(m.mtp_num_layers, "mtp_num_layers");
  using namespace spec_internal;
  RequireAtMost(m.num_layers, kMaxLayers, "num_layers");
  RequireAtMost(m.mtp_num_layers, kMaxLayers, "mtp_num_layers");
  RequireAtMost(m.moe_first_dense_layers, kMaxLayers, "moe_first_dense_layers");
  RequireAtMost(m.hidden_size, kMaxWidth, "hidden_size");
  RequireAtMost(m.num_attention_heads, kMaxWidth, "num_attention_heads");
  RequireAtMost(m.kv_channels, kMaxWidth, "kv_channels");
  RequireAtMost(m.q_lora_rank, kMaxWidth, "q_lora_rank");
  RequireAtMost(m.kv_lora_rank, kMaxWidth, "kv_lora_rank");
  RequireAtMost(m.qk_head_dim, kMaxWidth, "qk_head_dim");
  RequireAtMost(m.qk_pos_emb_head_dim, kMaxWidth, "qk_pos_emb_head_dim");
  RequireAtMost(m.v_head_dim, kMaxWidth, "v_head_dim");
  RequireAtMost(m.ffn_hidden_size, kMaxFfn, "ffn_hidden_size");
  RequireAtMost(m.moe_ffn_hidden_size, kMaxFfn, "moe_ffn_hidden_size");
  RequireAtMost(m.moe_shared_expert_intermediate_size, kMaxFfn,
                "moe_shared_expert_intermediate_size");
  RequireAtMost(m.vocab_size, kMaxVocabulary, "vocab_size");
  RequireAtMost(m.max_position_embeddings, kMaxSequence, "max_position_embeddings");
  RequireAtMost(m.window_size, kMaxSequence, "window_size");
  RequireAtMost(m.num_experts, kMaxExperts, "num_experts");
  if (m.window_attn_skip_freq > 0 && m.window_size == 0) {
    throw InputError("window_attn_skip_freq",
                     "needs window_size: it says which layers keep full attention among windowed "
                     "ones");
  }

  // Each query group shares one key/value head, so the query heads must split evenly.
  if (m.num_attention_heads % m.num_query_groups != 0) {
    throw InputError("num_query_groups", "num_attention_heads (" +
                                             std::to_string(m.num_attention_heads) +
                                             ") must be a multiple of num_query_groups (" +
                                             std::to_string(m.num_query_groups) + ")");
  }
  if (m.kv_channels == 0 && m.hidden_size % m.num_attention_heads != 0) {
    throw InputError("num_attention_heads",
                     "hidden_size (" + std::to_string(m.hidden_size) +
                         ") is not divisible by num_attention_heads (" +
                         std::to_string(m.num_attention_heads) +
                         "); give kv_channels to set the head dimension explicitly");
  }
  // Learned positions are a max_position_embeddings x hidden_size table: its size must be known.
  if (m.position_embedding == PositionEmbedding::kLearned && m.max_position_embeddings == 0) {
    throw InputError("max_position_embeddings",
                     "must be positive with learned_absolute position embeddings");
  }

  if (m.is_mla()) {
    RequirePositive(m.qk_head_dim, "qk_head_dim");
    RequirePositive(m.qk_pos_emb_head_dim, "qk_pos_emb_head_dim");
    RequirePositive(m.v_head_dim, "v_head_dim");
  }

  if (m.is_moe()) {
    if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_experts) {
      throw InputError("moe_router_topk", "must be between 1 and num_experts (" +
                                              std::to_string(m.num_experts) + "), got " +
                                              std::to_string(m.moe_router_topk));
    }
    RequirePositive(m.moe_ffn_hidden_size, "moe_ffn_hidden_size");
    if (m.moe_first_dense_layers >= m.num_layers) {
      throw InputError("moe_first_dense_layers", "must be less than num_layers (" +
                                                     std::to_string(m.num_layers) +
                                                     ") so that some layer has experts, got " +
                                                     std::to_string(m.moe_first_dense_layers));
    }
  }
}

}  // namespace autopar
