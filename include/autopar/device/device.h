// One accelerator (or the host standing in for one): budgeted memory, GEMM and the transformer ops.
//
// All ops are enqueued in order on the device's single compute stream; on the CPU they run
// synchronously. Synchronize() waits for everything enqueued, so host timing of a region is
// `Synchronize(); timer.Start(); ...; Synchronize(); timer.Seconds()`.
//
// Memory accounting lives here, shared by all devices: an allocation that would take bytes in use
// past the budget, or that the allocator refuses, returns kOom and changes nothing else, so the
// process stays healthy for the next (smaller) allocation. Budgets count requested bytes.
//
// Every op validates dtypes and the element counts it will touch and returns kInvalid on a
// mismatch; a view may be larger than what an op touches (elementwise ops, whose extent is the
// view, want equal sizes). "compute" below means compute_dtype() (f32 on the CPU, bf16 on
// CUDA); "f32" means fp32 whatever the device. Shapes and conventions are in ops.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "autopar/device/ops.h"
#include "autopar/device/status.h"
#include "autopar/device/tensor.h"

namespace autopar::device {

class Device {
 public:
  explicit Device(std::size_t budget_bytes) : budget_bytes_(budget_bytes) {}
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;
  virtual DType compute_dtype() const = 0;
  // Whether Gemm takes fp8 operands (GemmDesc::fp8_a/fp8_b): a GPU with fp8 tensor cores.
  virtual bool SupportsFp8() const { return false; }
  virtual Status Synchronize() = 0;

  // ---- memory ----
  StatusOr<Buffer> Allocate(std::size_t bytes);                // viewed as u8
  StatusOr<Buffer> Allocate(std::int64_t numel, DType dtype);  // viewed as numel x dtype
  std::size_t bytes_in_use() const { return in_use_.load(); }
  std::size_t peak_bytes() const { return peak_.load(); }
  std::size_t budget_bytes() const { return budget_bytes_; }
  void ResetPeak() { peak_.store(in_use_.load()); }  // peak := bytes in use now
  // Device memory the process holds now besides its tensors: the runtime's context, library
  // workspaces (cuBLAS, cuBLASLt), communicator buffers (NCCL), allocator rounding. A trial's
  // peak as training sees it is its tensor peak plus this, read after the step (NCCL sets up
  // connections at the first collective). 0 where the device has no such overhead (the CPU).
  virtual StatusOr<std::size_t> NonTensorBytes() { return std::size_t{0}; }
  // Waits for the device, then frees what it keeps between calls beyond the caller's tensors:
  // workspaces that only grow (the CUDA device's cuDNN attention arena and FP8 GEMM workspace,
  // allocated like tensors) and what its allocator caches. The trial runner calls it before it
  // reads its baseline, so a trial's peak counts the workspaces its own shapes need rather than
  // an earlier trial's (which would sit in the baseline, counted nowhere). Nothing on the CPU.
  virtual Status ReleaseCachedMemory() { return OkStatus(); }
  // The model's weights changed (the optimizer's step): a device that keeps copies derived from
  // weights across the micro-batches of a step drops them, so the next GEMM makes them anew. The
  // CUDA device keeps the FP8 copies of the weights (GemmDesc::fp8_b_is_weight), as Transformer
  // Engine quantizes a weight once per step. Nothing on the CPU.
  virtual void WeightsChanged() {}
  // The time by which every wait of the device must end, whatever its own bound per wait: the
  // trial's deadline while a trial runs (RunTrial sets it, and time_point::max(), none, after).
  // A wait still pending then gives up as kTimeout (the CUDA device aborting its communicators,
  // as on its own bound), so no rank outlives the trial's deadline inside the device. Nothing on
  // the CPU, whose only waits are the trial's own polls.
  virtual void SetDeadline(std::chrono::steady_clock::time_point deadline) { (void)deadline; }

  // ---- data movement and elementwise (any dtype for copies; f32 or compute otherwise) ----
  virtual Status CopyFromHost(Tensor dst, const void* src, std::size_t bytes) = 0;
  virtual Status CopyToHost(void* dst, Tensor src, std::size_t bytes) = 0;
  virtual Status Copy(Tensor dst, Tensor src) = 0;  // same dtype and numel
  // Copies a [rows, cols] block whose rows lie dst_stride and src_stride elements apart (same
  // dtype; the strides at least cols; neither block may overlap the other).
  virtual Status CopyRows(Tensor dst, std::int64_t dst_stride, Tensor src, std::int64_t src_stride,
                          std::int64_t rows, std::int64_t cols) = 0;
  virtual Status Fill(Tensor x, float value) = 0;
  virtual Status FillHash(Tensor x, const HashFill& fill) = 0;
  virtual Status Add(Tensor a, Tensor b, Tensor out) = 0;    // out = a + b; may alias
  virtual Status Axpy(float alpha, Tensor x, Tensor y) = 0;  // y += alpha * x
  virtual Status Scale(Tensor x, float alpha) = 0;           // x *= alpha
  virtual Status SumSquares(Tensor x, Tensor sum) = 0;       // sum[0] (f32) += sum x^2
  virtual Status CheckFinite(Tensor x) = 0;                  // kNonfinite on NaN/inf
  // out = residual + mask·x/(1 − p) with mask[i] (u8, 0 or 1) drawn as DropoutDesc says; and
  // backward, dx = mask·dy/(1 − p). out may alias residual, dx dy.
  virtual Status DropoutAdd(const DropoutDesc& d, Tensor x, Tensor residual, Tensor out,
                            Tensor mask) = 0;
  virtual Status DropoutBackward(const DropoutDesc& d, Tensor dy, Tensor mask, Tensor dx) = 0;

  // Typed host transfers: the tensor's dtype must match T and the counts must agree.
  template <typename T>
  Status Upload(Tensor dst, std::span<const T> src);
  template <typename T>
  Status Upload(Tensor dst, const std::vector<T>& src) {
    return Upload(dst, std::span<const T>(src));
  }
  template <typename T>
  StatusOr<std::vector<T>> Download(Tensor src);  // `device.Download<float>(t)`

  // ---- GEMM (a, b compute; c compute or f32) ----
  virtual Status Gemm(const GemmDesc& desc, Tensor a, Tensor b, Tensor c) = 0;

  // ---- norms: x, y, dy, dx compute; gamma, beta compute; dgamma, dbeta f32 (+=) ----
  virtual Status RmsNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor y,
                                Tensor rstd) = 0;
  virtual Status RmsNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma, Tensor rstd,
                                 Tensor dx, Tensor dgamma) = 0;
  virtual Status LayerNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor beta, Tensor y,
                                  Tensor mean, Tensor rstd) = 0;
  virtual Status LayerNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma,
                                   Tensor mean, Tensor rstd, Tensor dx, Tensor dgamma,
                                   Tensor dbeta) = 0;

  // ---- rotary embedding (compute; y may alias x, dx may alias dy) ----
  virtual Status RopeForward(const RopeDesc& d, Tensor x, Tensor y) = 0;
  virtual Status RopeBackward(const RopeDesc& d, Tensor dy, Tensor dx) = 0;

  // ---- activations (compute) ----
  // SwiGLU: x [rows, 2 * ffn] = [gate | up], y [rows, ffn] = silu(gate) * up.
  virtual Status SwiGluForward(std::int64_t rows, std::int64_t ffn, Tensor x, Tensor y) = 0;
  virtual Status SwiGluBackward(std::int64_t rows, std::int64_t ffn, Tensor dy, Tensor x,
                                Tensor dx) = 0;
  // GeLU, tanh approximation, elementwise over x.numel; y may alias x.
  virtual Status GeluForward(Tensor x, Tensor y) = 0;
  virtual Status GeluBackward(Tensor dy, Tensor x, Tensor dx) = 0;

  // ---- attention (q, k, v, out, dout, dq, dk, dv compute; lse f32) ----
  virtual Status AttentionForward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                                  Tensor lse) = 0;
  // Gradients of a chunk pair given the FINAL out and lse of the queries (after all merges), so a
  // context-parallel ring can run it per chunk; accumulate adds into dq, dk, dv instead of
  // overwriting them.
  virtual Status AttentionBackward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                                   Tensor dout, Tensor lse, Tensor dq, Tensor dk, Tensor dv,
                                   bool accumulate) = 0;
  // Merges a partial result into (out, lse) by log-sum-exp weights: rows = seq_q * batch * heads_q.
  virtual Status AttentionMerge(std::int64_t rows, std::int64_t head_dim, Tensor out, Tensor lse,
                                Tensor part_out, Tensor part_lse) = 0;
  // Empty while every attention call so far ran on the device's fast engine; otherwise one line
  // for the trial result saying how many calls fell back to the slower reference engine and the
  // first reason (the CUDA device: cuDNN's fused attention, else its CUDA-core kernel). The CPU
  // device has a single engine.
  virtual std::string AttentionEngineNote() const { return ""; }

  // ---- vocab-parallel cross-entropy (logits, dlogits compute; the rest f32, targets i32) ----
  virtual Status CrossEntropyMax(const CrossEntropyDesc& d, Tensor logits, Tensor row_max) = 0;
  virtual Status CrossEntropyPartials(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                      Tensor row_max, Tensor partials) = 0;
  virtual Status CrossEntropyLoss(const CrossEntropyDesc& d, Tensor row_max, Tensor partials,
                                  Tensor loss) = 0;
  virtual Status CrossEntropyBackward(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                                      Tensor row_max, Tensor partials, Tensor dloss,
                                      Tensor dlogits) = 0;

  // ---- embedding (table, out, dout compute; ids i32; dtable f32 +=) ----
  virtual Status EmbeddingForward(const EmbeddingDesc& d, Tensor table, Tensor ids, Tensor out) = 0;
  virtual Status EmbeddingBackward(const EmbeddingDesc& d, Tensor dout, Tensor ids,
                                   Tensor dtable) = 0;

  // ---- optimizer: master, grad, exp_avg, exp_avg_sq f32; model compute or empty ----
  // Updates master in place and, when model.numel > 0, writes it converted into model.
  virtual Status AdamStep(const AdamParams& p, Tensor master, Tensor grad, Tensor exp_avg,
                          Tensor exp_avg_sq, Tensor model) = 0;

 protected:
  // The raw allocator behind Allocate; nullptr or an error status means out of memory.
  virtual StatusOr<void*> AllocateRaw(std::size_t bytes) = 0;
  virtual void FreeRaw(void* data, std::size_t bytes) = 0;

 private:
  friend class Buffer;
  void Release(void* data, std::size_t bytes);

  const std::size_t budget_bytes_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
};

template <typename T>
Status Device::Upload(Tensor dst, std::span<const T> src) {
  AUTOPAR_CHECK_ARG(dst.dtype == DTypeOf<T>(), "Upload: dtype mismatch");
  AUTOPAR_CHECK_ARG(dst.numel == static_cast<std::int64_t>(src.size()), "Upload: size mismatch");
  return CopyFromHost(dst, src.data(), src.size_bytes());
}

template <typename T>
StatusOr<std::vector<T>> Device::Download(Tensor src) {
  AUTOPAR_CHECK_ARG(src.dtype == DTypeOf<T>(), "Download: dtype mismatch");
  AUTOPAR_CHECK_ARG(src.valid(), "Download: invalid tensor");
  std::vector<T> host(static_cast<std::size_t>(src.numel));
  AUTOPAR_RETURN_IF_ERROR(CopyToHost(host.data(), src, host.size() * sizeof(T)));
  return host;
}

}  // namespace autopar::device
