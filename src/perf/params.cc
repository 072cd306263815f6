#include "autopar/perf/params.h"

namespace autopar {
namespace {

int64_t NormParams(const ModelSpec& m, int64_t width) {
  return m.norm == NormKind::kLayerNorm ? 2 * width : width;  // LayerNorm has a bias
}

// Megatron-core's --qk-layernorm: a norm over head_dim for the queries and one for the keys (MLA:
// AttentionParams).
int64_t QkNormParams(const ModelSpec& m) {
  return m.has_qk_head_norms() ? 2 * NormParams(m, m.head_dim()) : 0;
}

int64_t AttentionParams(const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  const int64_t a = m.num_attention_heads;
  if (m.is_mla()) {
    // DeepSeek-V2/V3 multi-head latent attention: low-rank query and key/value projections.
    const int64_t qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    // --qk-layernorm normalizes the latents (Megatron-core's MLA q_layernorm, kv_layernorm).
    const int64_t latent_norm = m.qk_layernorm ? 1 : 0;
    const int64_t q = m.q_lora_rank > 0
                          ? h * m.q_lora_rank + latent_norm * m.q_lora_rank + m.q_lora_rank * a * qk
                          : h * a * qk;
    const int64_t kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + latent_norm * m.kv_lora_rank +
                       m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim);
    return q + kv + a * m.v_head_dim * h;
  }
  const int64_t d = m.head_dim();
  const int64_t g = m.num_query_groups;
  int64_t p = h * (a * d + 2 * g * d) + a * d * h;
  if (m.add_bias_linear) p += a * d + 2 * g * d + h;
  return p + QkNormParams(m);
}

int64_t MlpParams(const ModelSpec& m, int64_t ffn) {
  const int64_t h = m.hidden_size;
  if (m.activation == Activation::kSwiGLU) {
    return 3 * h * ffn + (m.add_bias_linear ? 2 * ffn + h : 0);
  }
  return 2 * h * ffn + (m.add_bias_linear ? ffn + h : 0);
}

}  // namespace

int64_t ParamCounts::moe_layer_non_expert() const {
  return attention_per_layer + moe_router_per_layer + shared_expert_per_layer + mlp_norm_per_layer;
}

int64_t ParamCounts::mtp_non_expert() const {
  return mtp_extra_per_module + (num_moe_layers > 0 ? moe_layer_non_expert() : dense_layer());
}

int64_t ParamCounts::mtp_experts() const { return num_moe_layers > 0 ? expert_per_layer : 0; }

int64_t ParamCounts::total() const {
  const int64_t dense_layers = num_layers - num_moe_layers;
  return embedding + output_layer + final_norm + dense_layers * dense_layer() +
         num_moe_layers * (moe_layer_non_expert() + expert_per_layer) +
         num_mtp_layers * (mtp_non_expert() + mtp_experts());
}

int64_t ParamCounts::active() const {
  const int64_t dense_layers = num_layers - num_moe_layers;
  const int64_t routed_active = num_experts > 0 ? expert_per_layer / num_experts * topk : 0;
  // The logits GEMM uses a vocab × hidden matrix whether or not it is tied to the embedding.
  const int64_t logits = output_layer > 0 ? output_layer : embedding;
  const int64_t mtp_routed = num_moe_layers > 0 ? routed_active : 0;
  return logits + dense_layers * dense_layer() +
         num_moe_layers * (moe_layer_non_expert() + routed_active) +
         num_mtp_layers * (mtp_non_expert() + mtp_routed + logits);
}

ParamCounts CountParams(const ModelSpec& m) {
  ParamCounts p;
  const int64_t h = m.hidden_size;
  p.num_layers = m.num_layers;
  p.num_moe_layers = m.num_moe_layers();
  p.num_experts = m.num_experts;
  p.topk = m.moe_router_topk;
  p.embedding = m.vocab_size * h;
  if (m.position_embedding == PositionEmbedding::kLearned) {
    p.embedding += m.max_position_embeddings * h;
  }
  p.output_layer = m.untie_embeddings ? m.vocab_size * h : 0;
  p.final_norm = NormParams(m, h);
  p.mlp_norm_per_layer = NormParams(m, h);
  p.norms_per_layer = 2 * NormParams(m, h) + QkNormParams(m);
  p.attention_per_layer = AttentionParams(m) + NormParams(m, h);
  p.dense_mlp_per_layer = MlpParams(m, m.ffn_hidden_size) + NormParams(m, h);
  p.num_mtp_layers = m.mtp_num_layers;
  p.mtp_extra_per_module = 2 * h * h + 3 * NormParams(m, h);
  if (m.is_moe()) {
    p.moe_router_per_layer = h * m.num_experts;
    p.expert_per_layer = m.num_experts * MlpParams(m, m.moe_ffn_hidden_size);
    if (m.moe_shared_expert_intermediate_size > 0) {
      p.shared_expert_per_layer = MlpParams(m, m.moe_shared_expert_intermediate_size);
    }
  }
  return p;
}

double CausalKeysPerQuery(double seq, double window) {
  if (window <= 0 || window >= seq) return 0.5 * seq;
  return (seq * window - 0.5 * window * window) / seq;
}

double ModelFlopsPerStep(const ModelSpec& m, int64_t global_batch_size, int64_t seq_length) {
  const ParamCounts p = CountParams(m);
  const double tokens = static_cast<double>(global_batch_size) * seq_length;
  const double qk_dim = m.is_mla() ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.head_dim();
  const double v_dim = m.is_mla() ? m.v_head_dim : m.head_dim();
  // Keys per query summed over the layers: seq for a full layer (PaLM's convention counts the
  // whole square), twice the causal mean for a windowed one.
  const int64_t windowed = m.num_windowed_layers(0, m.num_layers);
  const double keys =
      static_cast<double>(m.num_layers - windowed + m.mtp_num_layers) * seq_length +
      windowed * 2 * CausalKeysPerQuery(seq_length, static_cast<double>(m.window_size));
  // Forward attention scores: 2·keys·heads·(d_qk + d_v) FLOPs per token per layer; ×3 with
  // backward.
  const double attention = 6.0 * keys * m.num_attention_heads * (qk_dim + v_dim);
  return tokens * (6.0 * static_cast<double>(p.active()) + attention);
}

}  // namespace autopar
