// Parameter counts and FLOP counts of a ModelSpec, the arithmetic both the memory and the time
// model stand on.
#pragma once

#include <cstdint>

#include "autopar/spec/model.h"

namespace autopar {

struct ParamCounts {
  int64_t embedding = 0;          // word (+ learned position) embeddings
  int64_t output_layer = 0;       // untied output projection; 0 when tied
  int64_t final_norm = 0;
  int64_t attention_per_layer = 0;  // projections and the attention's norm(s)
  int64_t dense_mlp_per_layer = 0;  // a dense MLP block with its norm
  int64_t moe_router_per_layer = 0;
  int64_t expert_per_layer = 0;     // all routed experts of one MoE layer
  int64_t shared_expert_per_layer = 0;
  int64_t norms_per_layer = 0;      // of attention_per_layer + MLP, the replicated norm weights
  int64_t mlp_norm_per_layer = 0;   // the pre-MLP norm's (of a dense MLP block, or a MoE layer)
  // A multi-token-prediction module besides its transformer layer: the 2h -> h projection of the
  // normed embedding and hidden state, and its three norms (embedding and output are shared).
  int64_t mtp_extra_per_module = 0;

  int64_t dense_layer() const { return attention_per_layer + dense_mlp_per_layer; }
  // A MoE layer without its routed experts (attention, router, shared experts, norm).
  int64_t moe_layer_non_expert() const;
  // A multi-token-prediction module's transformer layer is of the last layer's kind.
  int64_t mtp_non_expert() const;  // the module without routed experts
  int64_t mtp_experts() const;     // its routed experts
  int64_t total() const;
  // Parameters one token touches (routed experts counted top-k times): the `N` of 6·N·tokens.
  // Each multi-token-prediction module adds its layer and one more logits GEMM.
  int64_t active() const;

  int64_t num_layers = 0;
  int64_t num_moe_layers = 0;
  int64_t num_experts = 0;
  int64_t topk = 0;
  int64_t num_mtp_layers = 0;
};

ParamCounts CountParams(const ModelSpec& m);

// The mean number of keys a query attends to under a causal mask over `seq` positions, within a
// sliding window of `window` keys (0: none): s/2 without a window, (s·w − w²/2)/s with w < s.
// Continuous in w, so a window as long as the sequence costs what full attention costs.
double CausalKeysPerQuery(double seq, double window);

// Model FLOPs of one training step (forward + backward, no recompute), PaLM convention:
// 6·N_active per token plus 12·layers·(heads·head_dim)·seq per token for attention scores; a
// windowed layer counts 2·CausalKeysPerQuery keys instead of seq (the same doubling of the causal
// work), a multi-token-prediction layer counts as a full-attention layer.
double ModelFlopsPerStep(const ModelSpec& m, int64_t global_batch_size, int64_t seq_length);

}  // namespace autopar
