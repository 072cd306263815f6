#include "fp8.h"

#include <algorithm>

namespace autopar {

// The operands follow Transformer Engine's linear modules as Megatron-core builds a layer
// (transformer_engine/pytorch/module/{linear,layernorm_linear,base}.py):
//  - A BF16 input is quantized by one cast kernel that reads it and writes the FP8 row-wise copy,
//    and on Hopper also the transposed copy the weight-gradient GEMM reads (cuBLAS FP8 GEMMs
//    take TN operands only; Blackwell's take any layout, nvte_is_non_tn_fp8_gemm_supported):
//    e + 1 + [Hopper] bytes per element. The output gradient gets the same cast in backward
//    (grad_output_preprocess).
//  - The inputs of the QKV and fc1 GEMMs come from the fused LayerNormLinear: the norm writes its
//    output in FP8 instead of BF16 ((1 − e) bytes per element against the BF16 run), and a
//    transpose of that FP8 copy (1 read + 1 write) makes the transposed one.
//  - Under sequence parallelism the FP8 row-wise copy is what is all-gathered (FP8 all-gather
//    supports no column-wise data), so the transposed copy is made in backward from the
//    re-gathered rows: 2 bytes per element of all T rows; a row-parallel layer's output gradient
//    is cast on the local rows, gathered in FP8 and transposed the same way.
//  - Saved for backward: the FP8 copy of each GEMM input (1 byte) instead of the BF16 one. The
//    norm outputs and the activation output were kept only for their GEMM, so they shrink; the
//    attention output is kept by the attention core as well, so the projection's FP8 copy comes
//    on top; in a MoE layer the pre-MLP norm's output is the router's and dispatcher's input, so
//    it stays BF16 and the shared experts' FP8 copy of it comes on top.
Fp8LayerTraffic Fp8Layer(const ModelSpec& m, const ParallelConfig& c, double tokens,
                         double element_bytes, bool transposed_copy, bool moe) {
  const double t = c.tp, e = element_bytes, tr = transposed_copy ? 1 : 0;
  const double h = m.hidden_size, a = m.num_attention_heads;
  const double qk = m.is_mla() ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.head_dim();
  const double v = m.is_mla() ? m.v_head_dim : m.head_dim();
  const double kv = m.is_mla() ? a : m.num_query_groups;
  const double tp_heads = a / t, tp_kv = std::max(kv / t, 1.0);
  const double fc1_factor = m.activation == Activation::kSwiGLU ? 2 : 1;  // gate and up
  // Rows of a column-parallel input on the rank before the SP all-gather, and after it.
  const double local_rows = tokens / (c.sp ? t : 1);

  auto cast = [&](double rows, double width) { return (e + 1 + tr) * rows * width; };
  // A row-parallel layer's output gradient (hidden wide).
  auto row_parallel_grad = [&] {
    return c.sp ? (e + 1) * local_rows * h + tr * 2 * tokens * h : cast(tokens, h);
  };
  Fp8LayerTraffic out;
  // A column-parallel input from a norm: fused (the norm writes FP8) or cast from its BF16 output.
  auto column_input = [&](bool fused_norm) {
    out.forward_bytes += (fused_norm ? 1 - e : e + 1) * local_rows * h;
    const double transpose = tr * (c.sp || fused_norm ? 2 : 1) * tokens * h;
    (c.sp ? out.backward_bytes : out.forward_bytes) += transpose;
  };

  // Attention: QKV (fused norm) and the output projection.
  column_input(true);
  out.forward_bytes += cast(tokens, tp_heads * v);
  out.backward_bytes += cast(tokens, tp_heads * qk + tp_kv * (qk + v)) + row_parallel_grad();
  out.saved_delta_bytes += -(e - 1) * local_rows * h + tokens * tp_heads * v;

  if (!moe) {  // fc1 (fused norm) and fc2
    const double ffn = m.ffn_hidden_size / t;
    column_input(true);
    out.forward_bytes += cast(tokens, ffn);
    out.backward_bytes += cast(tokens, fc1_factor * ffn) + row_parallel_grad();
    out.saved_delta_bytes += -(e - 1) * (local_rows * h + tokens * ffn);
    return out;
  }
  // Shared experts: an MLP on the norm's BF16 output.
  if (m.moe_shared_expert_intermediate_size > 0) {
    const double shared = m.moe_shared_expert_intermediate_size / t;
    column_input(false);
    out.forward_bytes += cast(tokens, shared);
    out.backward_bytes += cast(tokens, fc1_factor * shared) + row_parallel_grad();
    out.saved_delta_bytes += local_rows * h - (e - 1) * tokens * shared;
  }
  // Routed experts (grouped GEMMs): the rows the rank's experts see after dispatch and the etp
  // all-gather (docs/models.md §3.2), at width ffn_e/etp.
  const double et = c.expert_tp();
  const double rows = tokens * m.moe_router_topk * et / t, ffn_e = m.moe_ffn_hidden_size / et;
  out.forward_bytes += cast(rows, h) + cast(rows, ffn_e);
  out.backward_bytes += cast(rows, fc1_factor * ffn_e) + cast(rows, h);
  out.routed_saved_delta_bytes = -(e - 1) * rows * (h + ffn_e);
  return out;
}

Fp8Weights Fp8LayerWeights(const ParamCounts& p, bool moe) {
  if (!moe) return {static_cast<double>(p.dense_layer() - p.norms_per_layer), 0.0};
  return {
      static_cast<double>(p.moe_layer_non_expert() - p.moe_router_per_layer - p.norms_per_layer),
      static_cast<double>(p.expert_per_layer)};
}

Fp8Weights Fp8StageWeights(const ModelSpec& m, const ParamCounts& p, const ParallelConfig& c,
                           const StageLayout& layout, int64_t stage) {
  const Fp8Weights dense = Fp8LayerWeights(p, false), moe = Fp8LayerWeights(p, true);
  const double mtp = stage == c.pp - 1 ? static_cast<double>(m.mtp_num_layers) : 0.0;
  const double dense_layers =
      static_cast<double>(layout.all.dense_total()) + (m.is_moe() ? 0 : mtp);
  const double moe_layers = static_cast<double>(layout.all.moe_total()) + (m.is_moe() ? mtp : 0);
  return {(dense_layers * dense.dense + moe_layers * moe.dense) / c.tp,
          moe_layers * moe.experts / (c.expert_tp() * c.ep)};
}

}  // namespace autopar
