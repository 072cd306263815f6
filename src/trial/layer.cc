// One transformer layer of the step program: norms, the tensor-parallel region's entry and exit,
// attention (local, or split over the sequence by ContextAttention) and the MLP (dense, or a MoE
// layer's shared experts plus its routed experts), forward and backward.
#include <array>
#include <memory>
#include <utility>

#include "kernels/init.h"
#include "src/trial/linear.h"
#include "src/trial/program.h"

namespace autopar::trial {

using device::AttentionDesc;
using device::OkStatus;

// Megatron's default --norm-epsilon.
constexpr float kNormEps = 1e-5f;

Status StageProgram::Norm(const device::NormDesc& d, Tensor gamma, Tensor beta, Tensor x, Tensor y,
                          Tensor rstd, Tensor mean) {
  if (s_.rmsnorm) return dev_.RmsNormForward(d, x, gamma, y, rstd);
  return dev_.LayerNormForward(d, x, gamma, beta, y, mean, rstd);
}

Status StageProgram::NormBackward(const device::NormDesc& d, Tensor gamma, Tensor dgamma,
                                  Tensor dbeta, Tensor dy, Tensor x, Tensor rstd, Tensor mean,
                                  Tensor dx) {
  if (s_.rmsnorm) return dev_.RmsNormBackward(d, dy, x, gamma, rstd, dx, dgamma);
  return dev_.LayerNormBackward(d, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
}

Status StageProgram::Norm(Tensor gamma, Tensor beta, Tensor x, Tensor y, Tensor rstd, Tensor mean) {
  return Norm({s_.local_tokens, s_.hidden, kNormEps}, gamma, beta, x, y, rstd, mean);
}

Status StageProgram::NormBackward(Tensor gamma, Tensor dgamma, Tensor dbeta, Tensor dy, Tensor x,
                                  Tensor rstd, Tensor mean, Tensor dx) {
  return NormBackward({s_.local_tokens, s_.hidden, kNormEps}, gamma, dgamma, dbeta, dy, x, rstd,
                      mean, dx);
}

// ---- qk-layernorm ----

// Megatron-core's q_layernorm and k_layernorm (get_query_key_value_tensors): the model's norm over
// head_dim of each query head and each key head of the projection's output, before RoPE. The
// normalized heads replace the raw ones in the fused QKV buffer; the raw ones are what the
// backward needs (the norm's input), so they are kept, as the norm's saved input keeps them in
// PyTorch.
namespace {

// The query or the key heads: their norm over the fused QKV buffer's rows, its weights and what
// the forward keeps.
struct QkNormPart {
  device::NormDesc d;
  int64_t first_col;  // in the fused QKV buffer and in a.qk_x
  Tensor gamma, beta, d_gamma, d_beta, x, rstd, mean;
};

std::array<QkNormPart, 2> QkNormParts(const Shapes& s, const LayerWeights& w, const LayerActs& a) {
  const int64_t T = s.tokens, qk_cols = s.q_cols + s.kv_cols;
  auto part = [&](int64_t first_col, int64_t heads, int64_t first_stat, Tensor gamma, Tensor beta,
                  Tensor d_gamma, Tensor d_beta) {
    return QkNormPart{
        .d = {T, s.head_dim, kNormEps, heads, qk_cols, s.qkv_cols},
        .first_col = first_col,
        .gamma = gamma,
        .beta = beta,
        .d_gamma = d_gamma,
        .d_beta = d_beta,
        .x = a.qk_x.Slice(first_col, a.qk_x.numel - first_col),
        .rstd = a.qk_rstd.Slice(first_stat, T * heads),
        .mean = a.qk_mean.numel > 0 ? a.qk_mean.Slice(first_stat, T * heads) : Tensor{}};
  };
  return {part(0, s.heads, 0, w.q_norm, w.q_norm_bias, w.d_q_norm, w.d_q_norm_bias),
          part(s.q_cols, s.kv_heads, T * s.heads, w.k_norm, w.k_norm_bias, w.d_k_norm,
               w.d_k_norm_bias)};
}

}  // namespace

Status StageProgram::QkNormForward(const LayerWeights& w, const LayerActs& a, Tensor qkv) {
  if (!s_.qk_norm) return OkStatus();
  const int64_t qk_cols = s_.q_cols + s_.kv_cols;
  AUTOPAR_RETURN_IF_ERROR(dev_.CopyRows(a.qk_x, qk_cols, qkv, s_.qkv_cols, s_.tokens, qk_cols));
  for (const QkNormPart& p : QkNormParts(s_, w, a)) {
    const Tensor y = qkv.Slice(p.first_col, qkv.numel - p.first_col);
    AUTOPAR_RETURN_IF_ERROR(Norm(p.d, p.gamma, p.beta, p.x, y, p.rstd, p.mean));
  }
  return OkStatus();
}

Status StageProgram::QkNormBackward(const LayerWeights& w, const LayerActs& a) {
  if (!s_.qk_norm) return OkStatus();
  for (const QkNormPart& p : QkNormParts(s_, w, a)) {
    const Tensor dy = dqkv_.Slice(p.first_col, dqkv_.numel - p.first_col);  // dx in place
    AUTOPAR_RETURN_IF_ERROR(
        NormBackward(p.d, p.gamma, p.d_gamma, p.d_beta, dy, p.x, p.rstd, p.mean, dy));
  }
  return OkStatus();
}

// With SP the tensor-parallel region starts with an all-gather of the sequence shards;
// without it every tp rank already holds all rows.
StatusOr<Tensor> StageProgram::GatherRows(Tensor local, Tensor full) {
  if (!s_.sp) return local;
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllGather(local, full));
  return full;
}

// ...and ends with a reduce-scatter (SP) or an all-reduce of the row-parallel partial sums.
Status StageProgram::ReduceRows(Tensor partial, Tensor local_out) {
  if (s_.sp) return g_.tp.ReduceScatter(partial, local_out);
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllReduce(partial));
  return dev_.Copy(local_out, partial);
}

Status StageProgram::ColumnParallelBackward(const device::GemmDesc& dgrad,
                                            const device::GemmDesc& wgrad, Tensor dy, Tensor w,
                                            Tensor dw, Tensor x_local) {
  // megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication
  // (and Transformer Engine's Linear): the collectives run beside the GEMMs that do not need them.
  std::unique_ptr<device::Request> gather, reduce;
  Tensor x = x_local;
  if (s_.sp) {
    AUTOPAR_RETURN_IF_ERROR(g_.tp.StartAllGather(x_local, gathered_, gather));
    x = gathered_;
  }
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(dgrad, dy, w, partial_));
  AUTOPAR_RETURN_IF_ERROR(g_.tp.Wait(gather));
  AUTOPAR_RETURN_IF_ERROR(s_.sp ? g_.tp.StartReduceScatter(partial_, reduced_, reduce)
                                : g_.tp.StartAllReduce(partial_, reduce));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(wgrad, dy, x, dw));
  AUTOPAR_RETURN_IF_ERROR(g_.tp.Wait(reduce));
  return s_.sp ? OkStatus() : dev_.Copy(reduced_, partial_);
}

Status StageProgram::Rope(Tensor qkv, bool backward) {
  if (!s_.rope) return OkStatus();
  device::RopeDesc d;
  d.seq = s_.seq_local;  // the dense path: cp = up = 1
  d.batch = s_.mbs;
  d.head_dim = s_.head_dim;
  d.row_stride = s_.qkv_cols;
  const Tensor q = qkv.Slice(0, qkv.numel);
  const Tensor k = qkv.Slice(s_.q_cols, qkv.numel - s_.q_cols);
  for (auto [part, heads] : {std::pair{q, s_.heads}, std::pair{k, s_.kv_heads}}) {
    d.heads = heads;
    AUTOPAR_RETURN_IF_ERROR(backward ? dev_.RopeBackward(d, part, part)
                                     : dev_.RopeForward(d, part, part));
  }
  return OkStatus();
}

// ---- attention ----

// The causal attention of the whole local sequence (cp = up = 1), on the fused QKV buffer.
static AttentionDesc LocalAttention(const Shapes& s) {
  AttentionDesc att;
  att.batch = s.mbs;
  att.heads_q = s.heads;
  att.heads_kv = s.kv_heads;
  att.head_dim = s.head_dim;
  att.seq_q = att.seq_kv = s.seq_local;
  att.q_stride = att.kv_stride = s.qkv_cols;
  return att;
}

// From the projection's output `qkv` to a.o (and what backward needs).
Status StageProgram::AttentionForward(const LayerActs& a, Tensor qkv) {
  const Tensor lse = a.lse.numel > 0 ? a.lse : work_.lse;
  if (context_) {
    const Tensor o_ul = s_.up == 1 ? a.o : a.o_ul.numel > 0 ? a.o_ul : work_.o_ul;
    return context_->Forward(qkv, a.qkv, o_ul, lse, a.o);
  }
  AUTOPAR_RETURN_IF_ERROR(Rope(a.qkv, false));
  const int64_t n = a.qkv.numel;
  return dev_.AttentionForward(
      LocalAttention(s_), a.qkv.Slice(0, n), a.qkv.Slice(s_.q_cols, n - s_.q_cols),
      a.qkv.Slice(s_.q_cols + s_.kv_cols, n - s_.q_cols - s_.kv_cols), a.o, lse);
}

// From do_ to dqkv_ (RoPE undone), in the projection's layout.
Status StageProgram::AttentionBackward(const LayerActs& a) {
  Tensor lse = a.lse;
  Tensor o = context_ && s_.up > 1 ? a.o_ul : a.o;
  const bool recompute = lse.numel == 0;  // core_attn recompute kept q, k, v but not the statistics
  if (recompute) {
    lse = work_.lse;
    o = context_ && s_.up > 1 ? work_.o_ul : work_.o;
  }
  if (context_) {
    if (recompute) AUTOPAR_RETURN_IF_ERROR(context_->Core(a.qkv, o, lse));
    return context_->Backward(a.qkv, o, lse, do_, dqkv_);
  }
  const AttentionDesc att = LocalAttention(s_);
  const int64_t n = a.qkv.numel;
  const Tensor q = a.qkv.Slice(0, n), k = a.qkv.Slice(s_.q_cols, n - s_.q_cols),
               v = a.qkv.Slice(s_.q_cols + s_.kv_cols, n - s_.q_cols - s_.kv_cols);
  if (recompute) AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, o, lse));
  const int64_t dn = dqkv_.numel;
  AUTOPAR_RETURN_IF_ERROR(dev_.AttentionBackward(
      att, q, k, v, a.o, do_, lse, dqkv_.Slice(0, dn), dqkv_.Slice(s_.q_cols, dn - s_.q_cols),
      dqkv_.Slice(s_.q_cols + s_.kv_cols, dn - s_.q_cols - s_.kv_cols), false));
  return Rope(dqkv_, true);
}

// ---- MLP: dense, or shared experts + routed experts ----

Status StageProgram::DenseMlpForward(const LayerWeights& w, const LayerActs& a, Tensor y2) {
  const int64_t T = s_.tokens, h = s_.hidden, ffn = s_.MlpFfn(w.moe), fc1 = s_.MlpFc1Cols(w.moe);
  if (ffn == 0) return dev_.Fill(partial_, 0.0f);
  const Tensor h1 = a.h1.Slice(0, T * fc1), a1 = a.a1.Slice(0, T * ffn);
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, fc1, h, 0, s_.fp8), y2, w.fc1, h1));
  AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluForward(T, ffn, h1, a1)
                                    : dev_.GeluForward(h1, a1));
  return dev_.Gemm(Linear(T, h, ffn, 0, s_.fp8), a1, w.fc2, partial_);
}

// norm2's output a.y2 → reduced_ (the block's output rows of this rank).
Status StageProgram::MlpForward(const LayerWeights& w, const LayerActs& a, MoeActs& moe,
                                bool count_aux) {
  const int64_t T = s_.tokens, h = s_.hidden;
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y2, GatherRows(a.y2, gathered_));
  AUTOPAR_RETURN_IF_ERROR(DenseMlpForward(w, a, y2));
  if (w.moe) {
    // Each tp rank routes its slice of the rows and adds the result to those rows of the partial
    // sums, so the tp reduction below completes both parts.
    const int64_t rows = T / s_.tp, first = g_.at.tp * rows * h;
    AUTOPAR_RETURN_IF_ERROR(moe_->Forward(w, moe, y2.Slice(first, rows * h),
                                          partial_.Slice(first, rows * h), count_aux,
                                          RoutingDraws()));
  }
  return ReduceRows(partial_, reduced_);
}

// dout (the block's output gradient, local rows) → reduced_ (the gradient at norm2's output).
Status StageProgram::MlpBackward(const LayerWeights& w, const LayerActs& a, MoeActs& moe,
                                 Tensor dout) {
  const int64_t T = s_.tokens, h = s_.hidden, ffn = s_.MlpFfn(w.moe), fc1 = s_.MlpFc1Cols(w.moe);
  const int64_t rows = T / s_.tp, first = g_.at.tp * rows * h;
  const Tensor h1 = a.h1.Slice(0, T * fc1), a1 = a.a1.Slice(0, T * ffn);
  const Tensor dh1 = dh1_.Slice(0, T * fc1), da1 = da1_.Slice(0, T * ffn);
  // The backward of a reduce-scatter is an all-gather (and of an all-reduce, nothing).
  AUTOPAR_ASSIGN_OR_RETURN(Tensor d_partial, GatherRows(dout, gathered_));
  if (ffn > 0) {
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, h, ffn, s_.fp8), d_partial, a1, w.d_fc2));
    AUTOPAR_RETURN_IF_ERROR(
        dev_.Gemm(LinearInputGrad(T, h, ffn, 0, s_.fp8), d_partial, w.fc2, da1));
    AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluBackward(T, ffn, da1, h1, dh1)
                                      : dev_.GeluBackward(da1, h1, dh1));
  }
  if (!w.moe && ffn > 0) {  // a dense MLP: fc1 is a column-parallel linear like QKV
    return ColumnParallelBackward(LinearInputGrad(T, fc1, h, 0, s_.fp8),
                                  LinearWeightGrad(T, fc1, h, s_.fp8), dh1, w.fc1, w.d_fc1, a.y2);
  }
  if (w.moe)
    AUTOPAR_RETURN_IF_ERROR(moe_->BackwardExperts(w, moe, d_partial.Slice(first, rows * h)));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y2, GatherRows(a.y2, gathered_));
  if (ffn > 0) {
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, fc1, h, s_.fp8), dh1, y2, w.d_fc1));
    AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, fc1, h, 0, s_.fp8), dh1, w.fc1, partial_));
  } else {
    AUTOPAR_RETURN_IF_ERROR(dev_.Fill(partial_, 0.0f));
  }
  if (w.moe) {
    AUTOPAR_RETURN_IF_ERROR(
        moe_->BackwardRouter(w, moe, y2.Slice(first, rows * h), partial_.Slice(first, rows * h)));
  }
  return ReduceRows(partial_, reduced_);
}

Status StageProgram::RerunMlp(const LayerWeights& w, const LayerActs& a, MoeActs& moe) {
  // Megatron's checkpoint reruns the module's forward whole, collectives and (moe) the token
  // dispatcher's all-to-alls included; its output is not used, its activations are.
  if (w.moe ? s_.Reruns(kRecomputeMoe) : s_.Reruns(kRecomputeMlp)) {
    return MlpForward(w, a, moe, /*count_aux=*/false);
  }
  if (!w.moe || !s_.Reruns(kRecomputeSharedExperts)) return OkStatus();
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y2, GatherRows(a.y2, gathered_));
  return DenseMlpForward(w, a, y2);
}

// ---- one transformer layer ----

Status StageProgram::LayerForward(const LayerWeights& w, const LayerActs& a, MoeActs& moe, Tensor x,
                                  Tensor out, bool count_aux) {
  const int64_t T = s_.tokens, h = s_.hidden;
  // Attention block: x1 = x + proj(attention(rope(qk_norm(qkv(norm1(x)))))).
  AUTOPAR_RETURN_IF_ERROR(Norm(w.norm1, w.norm1_bias, x, a.y1, a.rstd1, a.mean1));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y1, GatherRows(a.y1, gathered_));
  // With Ulysses the projection's output is transient: the all-to-all's result is what is kept.
  const Tensor qkv = context_ && s_.up > 1 ? dqkv_ : a.qkv;
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, s_.qkv_cols, h, 0, s_.fp8), y1, w.qkv, qkv));
  AUTOPAR_RETURN_IF_ERROR(QkNormForward(w, a, qkv));
  AUTOPAR_RETURN_IF_ERROR(AttentionForward(a, qkv));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, h, s_.q_cols, 0, s_.fp8), a.o, w.proj, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, reduced_));
  AUTOPAR_RETURN_IF_ERROR(BlockResidualAdd(reduced_, x, a.x1, a.drop1, 1));
  // MLP block: out = x1 + mlp(norm2(x1)).
  AUTOPAR_RETURN_IF_ERROR(Norm(w.norm2, w.norm2_bias, a.x1, a.y2, a.rstd2, a.mean2));
  AUTOPAR_RETURN_IF_ERROR(MlpForward(w, a, moe, count_aux));
  return BlockResidualAdd(reduced_, a.x1, out, a.drop2, 2);
}

// Megatron's bias-dropout-add (no bias) on the block output's local rows, after the tensor-parallel
// region's reduce: under SP each rank drops its own sequence shard.
Status StageProgram::BlockResidualAdd(Tensor y, Tensor residual, Tensor out, Tensor mask,
                                      int site) {
  if (data_.hidden_dropout <= 0) return dev_.Add(residual, y, out);
  const device::DropoutDesc d{
      data_.hidden_dropout, kernels::ref::SplitMix64(dropout_seed_ + static_cast<uint64_t>(site))};
  return dev_.DropoutAdd(d, y, residual, out, mask);
}

StatusOr<Tensor> StageProgram::BlockOutputGrad(Tensor dy, Tensor mask, Tensor dx) {
  if (data_.hidden_dropout <= 0) return dy;
  const device::DropoutDesc d{data_.hidden_dropout, 0};  // the mask is stored: no draw
  AUTOPAR_RETURN_IF_ERROR(dev_.DropoutBackward(d, dy, mask, dx));
  return dx;
}

Status StageProgram::LayerBackward(const LayerWeights& w, const LayerActs& a, MoeActs& moe,
                                   Tensor dout, Tensor dx) {
  const int64_t T = s_.tokens, h = s_.hidden;
  // Selective recompute rebuilds what its modules dropped as the backward reaches them: the
  // pre-MLP norm's output and the MLP block's activations here, the input norm's output before
  // the attention block's linear layers.
  const bool norms = s_.Reruns(kRecomputeLayernorm);
  if (norms) {
    AUTOPAR_RETURN_IF_ERROR(Norm(w.norm2, w.norm2_bias, a.x1, a.y2, work_rstd_, work_mean_));
  }
  AUTOPAR_RETURN_IF_ERROR(RerunMlp(w, a, moe));
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor dmlp, BlockOutputGrad(dout, a.drop2, dtmp_));
  AUTOPAR_RETURN_IF_ERROR(MlpBackward(w, a, moe, dmlp));
  AUTOPAR_RETURN_IF_ERROR(
      NormBackward(w.norm2, w.d_norm2, w.d_norm2_bias, reduced_, a.x1, a.rstd2, a.mean2, dx1_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Add(dx1_, dout, dx1_));  // the residual path

  // Attention block.
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor dproj, BlockOutputGrad(dx1_, a.drop1, dtmp_));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor d_partial, GatherRows(dproj, gathered_));
  AUTOPAR_RETURN_IF_ERROR(
      dev_.Gemm(LinearWeightGrad(T, h, s_.q_cols, s_.fp8), d_partial, a.o, w.d_proj));
  AUTOPAR_RETURN_IF_ERROR(
      dev_.Gemm(LinearInputGrad(T, h, s_.q_cols, 0, s_.fp8), d_partial, w.proj, do_));
  AUTOPAR_RETURN_IF_ERROR(AttentionBackward(a));
  AUTOPAR_RETURN_IF_ERROR(QkNormBackward(w, a));
  if (norms) {
    AUTOPAR_RETURN_IF_ERROR(Norm(w.norm1, w.norm1_bias, a.x, a.y1, work_rstd_, work_mean_));
  }
  AUTOPAR_RETURN_IF_ERROR(ColumnParallelBackward(LinearInputGrad(T, s_.qkv_cols, h, 0, s_.fp8),
                                                 LinearWeightGrad(T, s_.qkv_cols, h, s_.fp8), dqkv_,
                                                 w.qkv, w.d_qkv, a.y1));
  AUTOPAR_RETURN_IF_ERROR(
      NormBackward(w.norm1, w.d_norm1, w.d_norm1_bias, reduced_, a.x, a.rstd1, a.mean1, dx));
  return dev_.Add(dx, dx1_, dx);
}

}  // namespace autopar::trial
