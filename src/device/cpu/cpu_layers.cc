// CPU device: row-wise and pointwise transformer ops, delegated to the host reference kernels
// after their arguments are checked. fp32 throughout (compute_dtype() is f32 here).
#include <cstring>
#include <string>

#include "kernels/activations.h"
#include "kernels/adam.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/norms.h"
#include "kernels/rope.h"
#include "src/device/cpu/cpu_device.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

kernels::ref::RopeShape ToRopeShape(const RopeDesc& d) {
  kernels::ref::RopeShape shape;
  shape.seq = d.seq;
  shape.batch = d.batch;
  shape.heads = d.heads;
  shape.head_dim = d.head_dim;
  shape.rotary_dim = d.rotary_dim;
  shape.position_offset = d.position_offset;
  shape.row_stride = d.row_stride;
  shape.base = d.base;
  return shape;
}

kernels::ref::NormLayout ToNormLayout(const NormDesc& d) {
  kernels::ref::NormLayout layout;
  layout.vectors = d.vectors;
  layout.x_stride = d.x_stride;
  layout.y_stride = d.y_stride;
  return layout;
}

Status CheckCrossEntropy(const CrossEntropyDesc& d) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("CrossEntropy", {d.rows, d.vocab_shard}));
  AUTOPAR_CHECK_ARG(d.vocab_start >= 0, "CrossEntropy: negative vocab_start");
  return OkStatus();
}

Status CheckIds(const char* op, const Tensor& ids, std::int64_t count) {
  const std::int32_t* p = ids.as<std::int32_t>();
  for (std::int64_t i = 0; i < count; ++i) {
    AUTOPAR_CHECK_ARG(p[i] >= 0, std::string(op) + ": negative id at " + std::to_string(i));
  }
  return OkStatus();
}

}  // namespace

Status CpuDevice::RmsNormForward(const NormDesc& desc, Tensor x, Tensor gamma, Tensor y,
                                 Tensor rstd) {
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, CheckRmsNormForward(desc, kF32, x, gamma, y, rstd));
  kernels::ref::RmsNormForward(x.as<float>(), gamma.as<float>(), d.rows, d.hidden, d.eps,
                               y.as<float>(), rstd.as<float>(), ToNormLayout(d));
  return OkStatus();
}

Status CpuDevice::RmsNormBackward(const NormDesc& desc, Tensor dy, Tensor x, Tensor gamma,
                                  Tensor rstd, Tensor dx, Tensor dgamma) {
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d,
                           CheckRmsNormBackward(desc, kF32, dy, x, gamma, rstd, dx, dgamma));
  kernels::ref::RmsNormBackward(dy.as<float>(), x.as<float>(), gamma.as<float>(), rstd.as<float>(),
                                d.rows, d.hidden, dx.as<float>(), dgamma.as<float>(),
                                ToNormLayout(d));
  return OkStatus();
}

Status CpuDevice::LayerNormForward(const NormDesc& desc, Tensor x, Tensor gamma, Tensor beta,
                                   Tensor y, Tensor mean, Tensor rstd) {
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d,
                           CheckLayerNormForward(desc, kF32, x, gamma, beta, y, mean, rstd));
  kernels::ref::LayerNormForward(x.as<float>(), gamma.as<float>(), beta.as<float>(), d.rows,
                                 d.hidden, d.eps, y.as<float>(), mean.as<float>(), rstd.as<float>(),
                                 ToNormLayout(d));
  return OkStatus();
}

Status CpuDevice::LayerNormBackward(const NormDesc& desc, Tensor dy, Tensor x, Tensor gamma,
                                    Tensor mean, Tensor rstd, Tensor dx, Tensor dgamma,
                                    Tensor dbeta) {
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, CheckLayerNormBackward(desc, kF32, dy, x, gamma, mean,
                                                                    rstd, dx, dgamma, dbeta));
  kernels::ref::LayerNormBackward(
      dy.as<float>(), x.as<float>(), gamma.as<float>(), mean.as<float>(), rstd.as<float>(), d.rows,
      d.hidden, dx.as<float>(), dgamma.as<float>(), dbeta.as<float>(), ToNormLayout(d));
  return OkStatus();
}

Status CpuDevice::RopeForward(const RopeDesc& desc, Tensor x, Tensor y) {
  AUTOPAR_ASSIGN_OR_RETURN(const RopeDesc d, ResolveRope(desc));
  const std::int64_t n = MatrixExtent(d.seq * d.batch, d.heads * d.head_dim, d.row_stride);
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("RopeForward", {{"x", x, kF32, n}, {"y", y, kF32, n}}));
  kernels::ref::RopeForward(ToRopeShape(d), x.as<float>(), y.as<float>());
  return OkStatus();
}

Status CpuDevice::RopeBackward(const RopeDesc& desc, Tensor dy, Tensor dx) {
  AUTOPAR_ASSIGN_OR_RETURN(const RopeDesc d, ResolveRope(desc));
  const std::int64_t n = MatrixExtent(d.seq * d.batch, d.heads * d.head_dim, d.row_stride);
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("RopeBackward", {{"dy", dy, kF32, n}, {"dx", dx, kF32, n}}));
  kernels::ref::RopeBackward(ToRopeShape(d), dy.as<float>(), dx.as<float>());
  return OkStatus();
}

Status CpuDevice::SwiGluForward(std::int64_t rows, std::int64_t ffn, Tensor x, Tensor y) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("SwiGluForward", {rows, ffn}));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("SwiGluForward", {{"x", x, kF32, rows * 2 * ffn}, {"y", y, kF32, rows * ffn}}));
  kernels::ref::SwiGluForward(x.as<float>(), rows, ffn, y.as<float>());
  return OkStatus();
}

Status CpuDevice::SwiGluBackward(std::int64_t rows, std::int64_t ffn, Tensor dy, Tensor x,
                                 Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("SwiGluBackward", {rows, ffn}));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("SwiGluBackward", {{"dy", dy, kF32, rows * ffn},
                                                       {"x", x, kF32, rows * 2 * ffn},
                                                       {"dx", dx, kF32, rows * 2 * ffn}}));
  AUTOPAR_CHECK_ARG(dx.data != x.data, "SwiGluBackward: dx may not alias x");
  kernels::ref::SwiGluBackward(dy.as<float>(), x.as<float>(), rows, ffn, dx.as<float>());
  return OkStatus();
}

Status CpuDevice::GeluForward(Tensor x, Tensor y) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("GeluForward", {{"x", x, kF32, 0}, {"y", y, kF32, x.numel}}));
  kernels::ref::GeluForward(x.as<float>(), x.numel, y.as<float>());
  return OkStatus();
}

Status CpuDevice::GeluBackward(Tensor dy, Tensor x, Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(
      "GeluBackward", {{"x", x, kF32, 0}, {"dy", dy, kF32, x.numel}, {"dx", dx, kF32, x.numel}}));
  kernels::ref::GeluBackward(dy.as<float>(), x.as<float>(), x.numel, dx.as<float>());
  return OkStatus();
}

Status CpuDevice::AttentionMerge(std::int64_t rows, std::int64_t head_dim, Tensor out, Tensor lse,
                                 Tensor part_out, Tensor part_lse) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("AttentionMerge", {rows, head_dim}));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("AttentionMerge", {{"out", out, kF32, rows * head_dim},
                                   {"lse", lse, kF32, rows},
                                   {"part_out", part_out, kF32, rows * head_dim},
                                   {"part_lse", part_lse, kF32, rows}}));
  kernels::ref::AttentionMerge(rows, head_dim, out.as<float>(), lse.as<float>(),
                               part_out.as<float>(), part_lse.as<float>());
  return OkStatus();
}

Status CpuDevice::CrossEntropyMax(const CrossEntropyDesc& d, Tensor logits, Tensor row_max) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(
      "CrossEntropyMax",
      {{"logits", logits, kF32, d.rows * d.vocab_shard}, {"row_max", row_max, kF32, d.rows}}));
  kernels::ref::CrossEntropyMax(logits.as<float>(), d.rows, d.vocab_shard, row_max.as<float>());
  return OkStatus();
}

Status CpuDevice::CrossEntropyPartials(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                       Tensor row_max, Tensor partials) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CrossEntropyPartials", {{"logits", logits, kF32, d.rows * d.vocab_shard},
                                         {"targets", targets, kI32, d.rows},
                                         {"row_max", row_max, kF32, d.rows},
                                         {"partials", partials, kF32, 2 * d.rows}}));
  AUTOPAR_RETURN_IF_ERROR(CheckIds("CrossEntropyPartials", targets, d.rows));
  kernels::ref::CrossEntropyPartials(logits.as<float>(), targets.as<std::int32_t>(), d.rows,
                                     d.vocab_shard, d.vocab_start, row_max.as<float>(),
                                     partials.as<float>());
  return OkStatus();
}

Status CpuDevice::CrossEntropyLoss(const CrossEntropyDesc& d, Tensor row_max, Tensor partials,
                                   Tensor loss) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("CrossEntropyLoss", {{"row_max", row_max, kF32, d.rows},
                                                         {"partials", partials, kF32, 2 * d.rows},
                                                         {"loss", loss, kF32, d.rows}}));
  kernels::ref::CrossEntropyLoss(row_max.as<float>(), partials.as<float>(), d.rows,
                                 loss.as<float>());
  return OkStatus();
}

Status CpuDevice::CrossEntropyBackward(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                       Tensor row_max, Tensor partials, Tensor dloss,
                                       Tensor dlogits) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  const std::int64_t n = d.rows * d.vocab_shard;
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CrossEntropyBackward", {{"logits", logits, kF32, n},
                                         {"targets", targets, kI32, d.rows},
                                         {"row_max", row_max, kF32, d.rows},
                                         {"partials", partials, kF32, 2 * d.rows},
                                         {"dloss", dloss, kF32, d.rows},
                                         {"dlogits", dlogits, kF32, n}}));
  AUTOPAR_RETURN_IF_ERROR(CheckIds("CrossEntropyBackward", targets, d.rows));
  kernels::ref::CrossEntropyBackward(logits.as<float>(), targets.as<std::int32_t>(),
                                     row_max.as<float>(), partials.as<float>(), dloss.as<float>(),
                                     d.rows, d.vocab_shard, d.vocab_start, dlogits.as<float>());
  return OkStatus();
}

Status CpuDevice::EmbeddingForward(const EmbeddingDesc& d, Tensor table, Tensor ids, Tensor out) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("EmbeddingForward", {d.tokens, d.hidden, d.vocab_shard}));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("EmbeddingForward", {{"table", table, kF32, d.vocab_shard * d.hidden},
                                     {"ids", ids, kI32, d.tokens},
                                     {"out", out, kF32, d.tokens * d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(CheckIds("EmbeddingForward", ids, d.tokens));
  kernels::ref::EmbeddingForward(table.as<float>(), ids.as<std::int32_t>(), d.tokens, d.hidden,
                                 d.vocab_shard, d.vocab_start, out.as<float>());
  return OkStatus();
}

Status CpuDevice::EmbeddingBackward(const EmbeddingDesc& d, Tensor dout, Tensor ids,
                                    Tensor dtable) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("EmbeddingBackward", {d.tokens, d.hidden, d.vocab_shard}));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("EmbeddingBackward", {{"dout", dout, kF32, d.tokens * d.hidden},
                                      {"ids", ids, kI32, d.tokens},
                                      {"dtable", dtable, kF32, d.vocab_shard * d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(CheckIds("EmbeddingBackward", ids, d.tokens));
  kernels::ref::EmbeddingBackward(dout.as<float>(), ids.as<std::int32_t>(), d.tokens, d.hidden,
                                  d.vocab_shard, d.vocab_start, dtable.as<float>());
  return OkStatus();
}

Status CpuDevice::AdamStep(const AdamParams& p, Tensor master, Tensor grad, Tensor exp_avg,
                           Tensor exp_avg_sq, Tensor model) {
  const std::int64_t n = master.numel;
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("AdamStep", {{"master", master, kF32, 0},
                                                 {"grad", grad, kF32, n},
                                                 {"exp_avg", exp_avg, kF32, n},
                                                 {"exp_avg_sq", exp_avg_sq, kF32, n},
                                                 {"model", model, kF32, 0}}));
  AUTOPAR_CHECK_ARG(model.numel == 0 || model.numel == n, "AdamStep: model size differs");
  AUTOPAR_CHECK_ARG(p.step >= 1, "AdamStep: step is 1-based");
  kernels::ref::AdamHyper hyper;
  hyper.lr = p.lr;
  hyper.beta1 = p.beta1;
  hyper.beta2 = p.beta2;
  hyper.eps = p.eps;
  hyper.weight_decay = p.weight_decay;
  hyper.grad_scale = p.grad_scale;
  hyper.step = p.step;
  kernels::ref::AdamStep(hyper, n, master.as<float>(), grad.as<float>(), exp_avg.as<float>(),
                         exp_avg_sq.as<float>());
  // fp32 model weights on the CPU: the "conversion" is a copy.
  if (model.numel > 0 && model.data != master.data) {
    std::memcpy(model.data, master.data, master.bytes());
  }
  return OkStatus();
}

}  // namespace autopar::device
