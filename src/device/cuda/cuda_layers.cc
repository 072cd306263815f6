// CUDA device: the transformer ops. Each checks its arguments exactly as the CPU device does
// (src/device/validate.h), with "compute" meaning the dtype of the op's first compute argument
// (bf16, or f32 for tight tests), then enqueues the kernels of kernels/*.cu. Attention goes to
// cuDNN's fused kernel when it takes the call (cudnn_attention.h), else to the CUDA-core kernel.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda_attention_plan.cuh"
#include "src/device/cuda/cuda_device.h"
#include "src/device/cuda/cudnn_attention_plan.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace kc = kernels::cuda;

namespace {

constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

Status CheckCrossEntropy(const CrossEntropyDesc& d) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("CrossEntropy", {d.rows, d.vocab_shard}));
  AUTOPAR_CHECK_ARG(d.vocab_start >= 0, "CrossEntropy: negative vocab_start");
  return OkStatus();
}

kc::AttentionArgs ToArgs(const AttentionDesc& d) {
  return kc::AttentionArgs{d.batch,  d.heads_q,  d.heads_kv,  d.head_dim, d.seq_q,    d.seq_kv,
                           d.causal, d.q_offset, d.kv_offset, d.scale,    d.q_stride, d.kv_stride};
}

// A resolved NormDesc (ResolveNorm) as the kernels take it.
kc::NormArgs ToArgs(const NormDesc& d) {
  return kc::NormArgs{d.rows, d.hidden, d.vectors, d.x_stride, d.y_stride};
}

}  // namespace

// ---- norms ----

Status CudaDevice::RmsNormForward(const NormDesc& desc, Tensor x, Tensor gamma, Tensor y,
                                  Tensor rstd) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("RmsNormForward", "x", x));
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, CheckRmsNormForward(desc, x.dtype, x, gamma, y, rstd));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::RmsNormForward(stream_, t, ToArgs(d), x.data, gamma.data, d.eps, y.data,
                                        rstd.as<float>()));
  return OkStatus();
}

Status CudaDevice::RmsNormBackward(const NormDesc& desc, Tensor dy, Tensor x, Tensor gamma,
                                   Tensor rstd, Tensor dx, Tensor dgamma) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("RmsNormBackward", "x", x));
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d,
                           CheckRmsNormBackward(desc, x.dtype, dy, x, gamma, rstd, dx, dgamma));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::RmsNormBackward(stream_, t, ToArgs(d), dy.data, x.data, gamma.data,
                                         rstd.as<float>(), dx.data, dgamma.as<float>()));
  return OkStatus();
}

Status CudaDevice::LayerNormForward(const NormDesc& desc, Tensor x, Tensor gamma, Tensor beta,
                                    Tensor y, Tensor mean, Tensor rstd) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("LayerNormForward", "x", x));
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d,
                           CheckLayerNormForward(desc, x.dtype, x, gamma, beta, y, mean, rstd));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::LayerNormForward(stream_, t, ToArgs(d), x.data, gamma.data, beta.data,
                                          d.eps, y.data, mean.as<float>(), rstd.as<float>()));
  return OkStatus();
}

Status CudaDevice::LayerNormBackward(const NormDesc& desc, Tensor dy, Tensor x, Tensor gamma,
                                     Tensor mean, Tensor rstd, Tensor dx, Tensor dgamma,
                                     Tensor dbeta) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("LayerNormBackward", "x", x));
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, CheckLayerNormBackward(desc, x.dtype, dy, x, gamma,
                                                                    mean, rstd, dx, dgamma, dbeta));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::LayerNormBackward(stream_, t, ToArgs(d), dy.data, x.data, gamma.data,
                                           mean.as<float>(), rstd.as<float>(), dx.data,
                                           dgamma.as<float>(), dbeta.as<float>()));
  return OkStatus();
}

// ---- rotary embedding ----

namespace {

Status Rope(CudaDevice& device, const char* op, const RopeDesc& desc, Tensor x, Tensor y,
            double sign) {
  AUTOPAR_ASSIGN_OR_RETURN(const RopeDesc d, ResolveRope(desc));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage(op, "x", x));
  const std::int64_t n = MatrixExtent(d.seq * d.batch, d.heads * d.head_dim, d.row_stride);
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(op, {{"x", x, x.dtype, n}, {"y", y, x.dtype, n}}));
  const kc::RopeArgs args{d.seq,        d.batch,           d.heads,      d.head_dim,
                          d.rotary_dim, d.position_offset, d.row_stride, double{d.base}};
  AUTOPAR_RETURN_IF_ERROR(device.Activate());
  AUTOPAR_CHECK_CUDA(kc::Rope(device.stream(), t, args, x.data, y.data, sign));
  return OkStatus();
}

}  // namespace

Status CudaDevice::RopeForward(const RopeDesc& d, Tensor x, Tensor y) {
  return Rope(*this, "RopeForward", d, x, y, 1.0);
}

Status CudaDevice::RopeBackward(const RopeDesc& d, Tensor dy, Tensor dx) {
  return Rope(*this, "RopeBackward", d, dy, dx, -1.0);
}

// ---- activations ----

Status CudaDevice::SwiGluForward(std::int64_t rows, std::int64_t ffn, Tensor x, Tensor y) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("SwiGluForward", {rows, ffn}));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("SwiGluForward", "x", x));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(
      "SwiGluForward", {{"x", x, x.dtype, rows * 2 * ffn}, {"y", y, x.dtype, rows * ffn}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::SwiGluForward(stream_, t, x.data, rows, ffn, y.data));
  return OkStatus();
}

Status CudaDevice::SwiGluBackward(std::int64_t rows, std::int64_t ffn, Tensor dy, Tensor x,
                                  Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("SwiGluBackward", {rows, ffn}));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("SwiGluBackward", "x", x));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("SwiGluBackward", {{"dy", dy, x.dtype, rows * ffn},
                                                       {"x", x, x.dtype, rows * 2 * ffn},
                                                       {"dx", dx, x.dtype, rows * 2 * ffn}}));
  AUTOPAR_CHECK_ARG(dx.data != x.data, "SwiGluBackward: dx may not alias x");
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::SwiGluBackward(stream_, t, dy.data, x.data, rows, ffn, dx.data));
  return OkStatus();
}

Status CudaDevice::GeluForward(Tensor x, Tensor y) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("GeluForward", "x", x));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("GeluForward", {{"x", x, x.dtype, 0}, {"y", y, x.dtype, x.numel}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::GeluForward(stream_, t, x.data, x.numel, y.data));
  return OkStatus();
}

Status CudaDevice::GeluBackward(Tensor dy, Tensor x, Tensor dx) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("GeluBackward", "x", x));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(
      "GeluBackward",
      {{"x", x, x.dtype, 0}, {"dy", dy, x.dtype, x.numel}, {"dx", dx, x.dtype, x.numel}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::GeluBackward(stream_, t, dy.data, x.data, x.numel, dx.data));
  return OkStatus();
}

// ---- attention ----

namespace {

// The tiles must fit the shared memory a block of this GPU may opt into.
Status CheckAttentionPlan(const AttentionDesc& d, int max_smem_bytes) {
  AUTOPAR_CHECK_ARG(d.head_dim <= 1024, "Attention: head_dim above 1024 is not supported");
  const kc::AttentionTilePlan plan = kc::PlanAttentionTiles(d.head_dim);
  AUTOPAR_CHECK_ARG(plan.MaxBytes() <= static_cast<std::size_t>(max_smem_bytes),
                    "Attention: head_dim " + std::to_string(d.head_dim) + " needs " +
                        std::to_string(plan.MaxBytes()) + " B of shared memory per block; " +
                        "this GPU allows " + std::to_string(max_smem_bytes));
  const std::int64_t q_tiles = (d.seq_q + plan.block_q - 1) / plan.block_q;
  const std::int64_t kv_tiles = (d.seq_kv + plan.block_kv - 1) / plan.block_kv;
  AUTOPAR_CHECK_ARG(q_tiles <= 65535 && kv_tiles <= 65535 && d.batch * d.heads_q <= INT32_MAX,
                    "Attention: sequence or batch * heads beyond the launch grid");
  return OkStatus();
}

}  // namespace

Status CudaDevice::AttentionForward(const AttentionDesc& desc, Tensor q, Tensor k, Tensor v,
                                    Tensor out, Tensor lse) {
  AUTOPAR_ASSIGN_OR_RETURN(const AttentionDesc d, ResolveAttention(desc));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("AttentionForward", "q", q));
  const std::int64_t rows = d.seq_q * d.batch * d.heads_q;
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("AttentionForward", {{"q", q, q.dtype, AttentionQExtent(d)},
                                                         {"k", k, q.dtype, AttentionKvExtent(d)},
                                                         {"v", v, q.dtype, AttentionKvExtent(d)},
                                                         {"out", out, q.dtype, rows * d.head_dim},
                                                         {"lse", lse, kF32, rows}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_ASSIGN_OR_RETURN(const bool on_cudnn,
                           AttentionOnCudnn(SdpaDirection::kForward, d, q, k, v, out, Tensor{}, lse,
                                            Tensor{}, Tensor{}, Tensor{}, false));
  if (on_cudnn) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(CheckAttentionPlan(d, max_smem_optin_));
  AUTOPAR_CHECK_CUDA(kc::AttentionForward(stream_, t, ToArgs(d), q.data, k.data, v.data, out.data,
                                          lse.as<float>(), max_smem_optin_));
  return OkStatus();
}

Status CudaDevice::AttentionBackward(const AttentionDesc& desc, Tensor q, Tensor k, Tensor v,
                                     Tensor out, Tensor dout, Tensor lse, Tensor dq, Tensor dk,
                                     Tensor dv, bool accumulate) {
  AUTOPAR_ASSIGN_OR_RETURN(const AttentionDesc d, ResolveAttention(desc));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("AttentionBackward", "q", q));
  const std::int64_t rows = d.seq_q * d.batch * d.heads_q;
  const std::int64_t q_need = AttentionQExtent(d);
  const std::int64_t kv_need = AttentionKvExtent(d);
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("AttentionBackward", {{"q", q, q.dtype, q_need},
                                      {"k", k, q.dtype, kv_need},
                                      {"v", v, q.dtype, kv_need},
                                      {"out", out, q.dtype, rows * d.head_dim},
                                      {"dout", dout, q.dtype, rows * d.head_dim},
                                      {"lse", lse, kF32, rows},
                                      {"dq", dq, q.dtype, q_need},
                                      {"dk", dk, q.dtype, kv_need},
                                      {"dv", dv, q.dtype, kv_need}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_ASSIGN_OR_RETURN(const bool on_cudnn,
                           AttentionOnCudnn(SdpaDirection::kBackward, d, q, k, v, out, dout, lse,
                                            dq, dk, dv, accumulate));
  if (on_cudnn) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(CheckAttentionPlan(d, max_smem_optin_));
  AUTOPAR_CHECK_CUDA(kc::AttentionBackward(stream_, t, ToArgs(d), q.data, k.data, v.data, out.data,
                                           dout.data, lse.as<float>(), dq.data, dk.data, dv.data,
                                           accumulate, max_smem_optin_));
  return OkStatus();
}

// ---- attention engine ----

void CudaDevice::SetAttentionEngine(AttentionEngine engine) { attention_engine_ = engine; }

void CudaDevice::CountAttention(const std::string& fallback_reason) {
  std::lock_guard<std::mutex> lock(attention_note_mu_);
  ++attention_calls_;
  if (fallback_reason.empty()) return;
  if (attention_fallbacks_++ == 0) attention_first_fallback_ = fallback_reason;
}

std::string CudaDevice::AttentionEngineNote() const {
  std::lock_guard<std::mutex> lock(attention_note_mu_);
  if (attention_fallbacks_ == 0) return "";
  return "attention: " + std::to_string(attention_fallbacks_) + " of " +
         std::to_string(attention_calls_) +
         " calls ran on the CUDA-core kernel instead of cuDNN; first: " + attention_first_fallback_;
}

StatusOr<bool> CudaDevice::AttentionOnCudnn(SdpaDirection direction, const AttentionDesc& d,
                                            Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout,
                                            Tensor lse, Tensor dq, Tensor dk, Tensor dv,
                                            bool accumulate) {
  if (!attention_engine_.has_value()) {
    const char* env = std::getenv("AUTOPAR_ATTENTION");
    AUTOPAR_ASSIGN_OR_RETURN(attention_engine_, ParseAttentionEngine(env != nullptr ? env : ""));
  }
  const AttentionEngine engine = *attention_engine_;
  const bool backward = direction == SdpaDirection::kBackward;
  auto fall_back = [&](const std::string& why) -> StatusOr<bool> {
    if (engine == AttentionEngine::kCudnn) {
      return Status::Error(Outcome::kInvalid, "AUTOPAR_ATTENTION=cudnn, but cuDNN cannot: " + why,
                           __FILE__, __LINE__);
    }
    CountAttention(why);
    return false;
  };
  if (engine == AttentionEngine::kKernel) return fall_back("AUTOPAR_ATTENTION=kernel");

  bool aligned = true;
  for (const Tensor& t : {q, k, v, out, dout, dq, dk, dv}) {
    aligned = aligned && reinterpret_cast<std::uintptr_t>(t.data) % kSdpaAlignmentBytes == 0;
  }
  const SdpaDecision decision =
      DecideSdpa(d, q.dtype, direction, aligned, accumulate, CudnnAttention::LibraryVersion());
  if (!decision.use_cudnn) return fall_back(decision.reason);

  if (cudnn_attention_ == nullptr) {
    if (!cudnn_unavailable_.empty()) return fall_back(cudnn_unavailable_);
    AUTOPAR_ASSIGN_OR_RETURN(cublasHandle_t cublas, cublas_.Get(stream_));
    StatusOr<std::unique_ptr<CudnnAttention>> made = CudnnAttention::Create(
        stream_, cublas, [this](std::size_t bytes) { return Allocate(bytes); },
        [this] { return Synchronize(); });
    if (!made.ok()) {
      cudnn_unavailable_ = "cuDNN unavailable: " + made.status().message();
      return fall_back(cudnn_unavailable_);
    }
    cudnn_attention_ = std::move(made).value();
  }
  CudnnAttention::Attempt attempt;
  if (backward) {
    AUTOPAR_ASSIGN_OR_RETURN(
        attempt, cudnn_attention_->Backward(decision.key, d.scale, q.data, k.data, v.data, out.data,
                                            dout.data, lse.as<float>(), dq.data, dk.data, dv.data,
                                            accumulate));
  } else {
    AUTOPAR_ASSIGN_OR_RETURN(
        attempt, cudnn_attention_->Forward(decision.key, d.scale, q.data, k.data, v.data, out.data,
                                           lse.as<float>()));
  }
  if (!attempt.ran) return fall_back(attempt.why_not);
  CountAttention("");
  return true;
}

Status CudaDevice::AttentionMerge(std::int64_t rows, std::int64_t head_dim, Tensor out, Tensor lse,
                                  Tensor part_out, Tensor part_lse) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("AttentionMerge", {rows, head_dim}));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("AttentionMerge", "out", out));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("AttentionMerge", {{"out", out, out.dtype, rows * head_dim},
                                   {"lse", lse, kF32, rows},
                                   {"part_out", part_out, out.dtype, rows * head_dim},
                                   {"part_lse", part_lse, kF32, rows}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::AttentionMerge(stream_, t, rows, head_dim, out.data, lse.as<float>(),
                                        part_out.data, part_lse.as<float>()));
  return OkStatus();
}

// ---- cross-entropy ----

Status CudaDevice::CrossEntropyMax(const CrossEntropyDesc& d, Tensor logits, Tensor row_max) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t,
                           ComputeStorage("CrossEntropyMax", "logits", logits));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CrossEntropyMax", {{"logits", logits, logits.dtype, d.rows * d.vocab_shard},
                                    {"row_max", row_max, kF32, d.rows}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(
      kc::CrossEntropyMax(stream_, t, logits.data, d.rows, d.vocab_shard, row_max.as<float>()));
  return OkStatus();
}

Status CudaDevice::CrossEntropyPartials(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                        Tensor row_max, Tensor partials) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t,
                           ComputeStorage("CrossEntropyPartials", "logits", logits));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CrossEntropyPartials", {{"logits", logits, logits.dtype, d.rows * d.vocab_shard},
                                         {"targets", targets, kI32, d.rows},
                                         {"row_max", row_max, kF32, d.rows},
                                         {"partials", partials, kF32, 2 * d.rows}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::CrossEntropyPartials(stream_, t, logits.data, targets.as<std::int32_t>(),
                                              d.rows, d.vocab_shard, d.vocab_start,
                                              row_max.as<float>(), partials.as<float>()));
  return OkStatus();
}

Status CudaDevice::CrossEntropyLoss(const CrossEntropyDesc& d, Tensor row_max, Tensor partials,
                                    Tensor loss) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("CrossEntropyLoss", {{"row_max", row_max, kF32, d.rows},
                                                         {"partials", partials, kF32, 2 * d.rows},
                                                         {"loss", loss, kF32, d.rows}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::CrossEntropyLoss(stream_, row_max.as<float>(), partials.as<float>(),
                                          d.rows, loss.as<float>()));
  return OkStatus();
}

Status CudaDevice::CrossEntropyBackward(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                        Tensor row_max, Tensor partials, Tensor dloss,
                                        Tensor dlogits) {
  AUTOPAR_RETURN_IF_ERROR(CheckCrossEntropy(d));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t,
                           ComputeStorage("CrossEntropyBackward", "logits", logits));
  const std::int64_t n = d.rows * d.vocab_shard;
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CrossEntropyBackward", {{"logits", logits, logits.dtype, n},
                                         {"targets", targets, kI32, d.rows},
                                         {"row_max", row_max, kF32, d.rows},
                                         {"partials", partials, kF32, 2 * d.rows},
                                         {"dloss", dloss, kF32, d.rows},
                                         {"dlogits", dlogits, logits.dtype, n}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::CrossEntropyBackward(
      stream_, t, logits.data, targets.as<std::int32_t>(), row_max.as<float>(),
      partials.as<float>(), dloss.as<float>(), d.rows, d.vocab_shard, d.vocab_start, dlogits.data));
  return OkStatus();
}

// ---- embedding ----

Status CudaDevice::EmbeddingForward(const EmbeddingDesc& d, Tensor table, Tensor ids, Tensor out) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("EmbeddingForward", {d.tokens, d.hidden, d.vocab_shard}));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("EmbeddingForward", "table", table));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("EmbeddingForward", {{"table", table, table.dtype, d.vocab_shard * d.hidden},
                                     {"ids", ids, kI32, d.tokens},
                                     {"out", out, table.dtype, d.tokens * d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::EmbeddingForward(stream_, t, table.data, ids.as<std::int32_t>(), d.tokens,
                                          d.hidden, d.vocab_shard, d.vocab_start, out.data));
  return OkStatus();
}

Status CudaDevice::EmbeddingBackward(const EmbeddingDesc& d, Tensor dout, Tensor ids,
                                     Tensor dtable) {
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("EmbeddingBackward", {d.tokens, d.hidden, d.vocab_shard}));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("EmbeddingBackward", "dout", dout));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("EmbeddingBackward", {{"dout", dout, dout.dtype, d.tokens * d.hidden},
                                      {"ids", ids, kI32, d.tokens},
                                      {"dtable", dtable, kF32, d.vocab_shard * d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::EmbeddingBackward(stream_, t, dout.data, ids.as<std::int32_t>(), d.tokens,
                                           d.hidden, d.vocab_shard, d.vocab_start,
                                           dtable.as<float>()));
  return OkStatus();
}

// ---- optimizer ----

Status CudaDevice::AdamStep(const AdamParams& p, Tensor master, Tensor grad, Tensor exp_avg,
                            Tensor exp_avg_sq, Tensor model) {
  const std::int64_t n = master.numel;
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("AdamStep", {{"master", master, kF32, 0},
                                                 {"grad", grad, kF32, n},
                                                 {"exp_avg", exp_avg, kF32, n},
                                                 {"exp_avg_sq", exp_avg_sq, kF32, n}}));
  kc::Storage model_t = kc::Storage::kBF16;
  if (model.numel > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(model_t, ComputeStorage("AdamStep", "model", model));
    AUTOPAR_CHECK_ARG(model.valid() && model.numel == n, "AdamStep: model size differs");
  }
  AUTOPAR_CHECK_ARG(p.step >= 1, "AdamStep: step is 1-based");
  // The per-step scalars exactly as kernels::ref::AdamStep<float> forms them (double, then
  // float), so the device's fp32 arithmetic reproduces the host's.
  const double t = static_cast<double>(p.step);
  const double lr = p.lr;
  kc::AdamScalars s{};
  s.decay = static_cast<float>(1.0 - lr * double{p.weight_decay});
  s.beta1 = static_cast<float>(double{p.beta1});
  s.beta2 = static_cast<float>(double{p.beta2});
  s.one_minus_beta1 = static_cast<float>(1.0 - double{p.beta1});
  s.one_minus_beta2 = static_cast<float>(1.0 - double{p.beta2});
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(double{p.beta1}, t)));
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(double{p.beta2}, t)));
  s.eps = static_cast<float>(double{p.eps});
  s.grad_scale = static_cast<float>(double{p.grad_scale});
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::AdamStep(stream_, s, n, master.as<float>(), grad.as<float>(),
                                  exp_avg.as<float>(), exp_avg_sq.as<float>(), model_t,
                                  model.numel > 0 ? model.data : nullptr));
  return OkStatus();
}

}  // namespace autopar::device
