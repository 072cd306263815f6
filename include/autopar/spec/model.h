// ModelSpec: the architecture of a decoder-only transformer, dense or mixture-of-experts.
//
// Field names follow Megatron-LM arguments where one exists (`num_layers`, `hidden_size`,
// `ffn_hidden_size`, `num_attention_heads`, `num_query_groups`, ...), so presets, YAML files,
// Hugging Face `config.json` and pasted Megatron flags all land in the same struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autopar {

enum class Activation { kSwiGLU, kGeLU };
enum class NormKind { kRMSNorm, kLayerNorm };
enum class PositionEmbedding { kRope, kLearned };

const char* ToString(Activation a);
const char* ToString(NormKind n);
const char* ToString(PositionEmbedding p);

struct ModelSpec {
  std::string name;

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;       // dense MLP width (the intermediate size)
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;      // key/value heads; == num_attention_heads without GQA
  int64_t kv_channels = 0;           // head dimension; 0 means hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // the model's native context (informational for RoPE)

  Activation activation = Activation::kSwiGLU;
  NormKind norm = NormKind::kRMSNorm;
  PositionEmbedding position_embedding = PositionEmbedding::kRope;
  bool untie_embeddings = true;      // separate output layer (LLaMA) or tied (GPT-3)
  bool add_bias_linear = false;      // biases on the linear layers (GPT-3 style)
  // Megatron-core's --qk-layernorm (Qwen3, OLMo 2, Gemma 3): the model's norm over each head's
  // query and key vectors after the QKV projection, before RoPE; one weight of head_dim
  // elements (and a bias under LayerNorm) for the queries and one for the keys, per layer.
  bool qk_layernorm = false;

  // Multi-head latent attention (DeepSeek-V2/V3). Zero kv_lora_rank means ordinary attention.
  int64_t q_lora_rank = 0;           // 0: queries are projected without a low-rank bottleneck
  int64_t kv_lora_rank = 0;
  int64_t qk_head_dim = 0;           // the non-rotary part of a query/key head
  int64_t qk_pos_emb_head_dim = 0;   // the rotary part
  int64_t v_head_dim = 0;

  // Mixture of experts. num_experts == 0 means a dense model.
  int64_t num_experts = 0;
  int64_t moe_router_topk = 0;
  int64_t moe_ffn_hidden_size = 0;   // width of one routed expert
  int64_t moe_shared_expert_intermediate_size = 0;  // total width of the shared experts; 0: none
  int64_t moe_first_dense_layers = 0;  // leading layers with a dense MLP (DeepSeek-V3: 3)

  // Sliding-window attention, as Megatron-LM's --window-size W,0 and --window-attn-skip-freq N:
  // a windowed layer's query sees at most the window_size keys before it (W, Megatron's LEFT;
  // Hugging Face's `sliding_window`).
  // window_attn_skip_freq N > 0 leaves every N-th layer (1-based: layers N, 2N, ...) with full
  // attention; 0 windows every layer. window_size 0: full attention everywhere.
  int64_t window_size = 0;
  int64_t window_attn_skip_freq = 0;

  // Multi-token prediction (DeepSeek-V3, Megatron-LM's --mtp-num-layers): modules after the last
  // layer, each a transformer layer of the last layer's kind plus a 2h -> h projection and three
  // norms, sharing the embedding and the output layer, and computing the logits again.
  int64_t mtp_num_layers = 0;

  bool is_moe() const { return num_experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  // Whether each layer norms every query and key head (--qk-layernorm on ordinary attention; under
  // MLA the flag builds the latent norms instead, which the latent projections account for).
  bool has_qk_head_norms() const { return qk_layernorm && !is_mla(); }
  int64_t head_dim() const {
    return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads;
  }
  int64_t num_moe_layers() const { return is_moe() ? num_layers - moe_first_dense_layers : 0; }
  // Whether layer `layer` (0-based) attends through the sliding window.
  bool is_windowed_layer(int64_t layer) const {
    return window_size > 0 &&
           (window_attn_skip_freq == 0 || (layer + 1) % window_attn_skip_freq != 0);
  }
  // Windowed layers among layers [first, first + count).
  int64_t num_windowed_layers(int64_t first, int64_t count) const;
};

// Throws InputError naming the first field that is missing, non-positive or inconsistent.
void Validate(const ModelSpec& m);

}  // namespace autopar
