// What Transformer Engine's FP8 training adds around one transformer layer's linear layers
// (docs/models.md §3.2, §4.2): the bytes its quantization kernels move, and the FP8 copies it
// keeps for backward in place of (or besides) the BF16 tensors. Internal to src/perf.
//
// Megatron-core runs every TE linear layer of the transformer layers in FP8 (delayed scaling, its
// --fp8-recipe default; --first-last-layers-bf16 off); the output layer is Megatron's own
// ColumnParallelLinear and stays BF16, and so does attention (no --fp8-dot-product-attention).
#pragma once

#include "autopar/perf/params.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "stages.h"

namespace autopar {

// One layer, one micro-batch, one rank.
struct Fp8LayerTraffic {
  double forward_bytes = 0;   // quantizing each GEMM's input activation
  double backward_bytes = 0;  // quantizing each GEMM's output gradient (and gathered inputs)
  // Activations kept for backward, FP8 run minus BF16 run (negative where FP8 saves), split as
  // the memory model splits a layer: without and with its routed experts' part.
  double saved_delta_bytes = 0;
  double routed_saved_delta_bytes = 0;
};

// `tokens` the micro-batch's rows on the rank (b·s/(cp·up)), `element_bytes` the BF16 tensors'
// 2, `transposed_copy` whether FP8 GEMMs need a transposed FP8 copy of each operand (Hopper,
// Fp8TraitsOf), `moe` a MoE layer (else dense).
Fp8LayerTraffic Fp8Layer(const ModelSpec& m, const ParallelConfig& c, double tokens,
                         double element_bytes, bool transposed_copy, bool moe);

// Linear-layer weights of one layer that run in FP8 (the router, norms and biases of the layer
// stay BF16): dense ones (split by tp) and routed experts (split by etp·ep).
struct Fp8Weights {
  double dense = 0;
  double experts = 0;
  double total() const { return dense + experts; }
};
Fp8Weights Fp8LayerWeights(const ParamCounts& p, bool moe);

// The FP8 weights one rank of `stage` holds: its layers' and, on the last stage, those of the
// multi-token-prediction modules' layers; dense ones divided by tp, experts by etp·ep (kept apart,
// as the distributed optimizer shards them over different groups).
Fp8Weights Fp8StageWeights(const ModelSpec& m, const ParamCounts& p, const ParallelConfig& c,
                           const StageLayout& layout, int64_t stage);

// Bytes per FP8 weight that TE caches across the micro-batches of a step (Megatron passes
// is_first_microbatch, so the weights are quantized once per step): the FP8 copy and, where the
// GEMMs need it, its transpose.
inline double Fp8WeightCacheBytes(bool transposed_copy) { return transposed_copy ? 2 : 1; }

}  // namespace autopar
