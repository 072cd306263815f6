// The CUDA device: tensors from a stream-ordered memory pool of its own under the budget, one
// non-blocking compute stream, cuBLAS GEMMs and the kernels of kernels/*.cu (launchers in
// kernels/cuda_kernels.cuh).
//
// Tensors are allocated and freed in the compute stream's order (cudaMallocFromPoolAsync,
// cudaFreeAsync), not with cudaMalloc/cudaFree: "Managing memory allocations using cudaMalloc and
// cudaFree causes the GPU to synchronize across all executing CUDA streams" (CUDA Programming
// Guide, Stream-Ordered Memory Allocator). A cudaFree in a step (MoE's per-micro-batch buffers,
// an arena that grows) would stall the host until the device is idle, with no deadline (a hung
// NCCL kernel would hang the worker), and end any overlap of the side streams' collectives with
// compute there; a training job's caching allocator does neither. Other streams only use a tensor
// after an event recorded on the compute stream after its allocation (NcclComm::Async), and a
// tensor is freed only once the work of other streams on it is ordered before the free
// (requests are completed or aborted first), as the pool's stream-ordered reuse requires.
//
// Waiting never blocks in the driver: Synchronize and the host copies poll the stream (nccl-tests'
// testStreamSynchronize), checking every watched NCCL communicator for an asynchronous error and
// aborting them all at the deadline, so a dead peer turns into kCommError or kTimeout instead of a
// hung worker.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "autopar/device/device.h"
#include "kernels/cuda_kernels.cuh"
#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/cudnn_attention.h"
#include "src/device/cuda/fp8_gemm.h"

namespace autopar::device {

double SteadySeconds();  // monotonic clock, for deadlines

// When a wait that began at `started_s` must end: `timeout_s` later (the device's bound per wait)
// or at `deadline_s` (the trial's, Device::SetDeadline), whichever comes first. SteadySeconds().
constexpr double WaitEndS(double started_s, double timeout_s, double deadline_s) {
  return started_s + timeout_s < deadline_s ? started_s + timeout_s : deadline_s;
}

// A steady_clock time point as SteadySeconds() counts it; time_point::max() is +inf.
double ToSteadySeconds(std::chrono::steady_clock::time_point t);

// A communicator the device watches while it waits (implemented in nccl_collectives.cc).
class CommWatch {
 public:
  virtual ~CommWatch() = default;
  // kCommError once the communicator has failed asynchronously; ok while healthy or aborted.
  virtual Status AsyncError() = 0;
  // ncclCommAbort, once; later operations on the communicator are kCommError.
  virtual void Abort() = 0;
};

// A library handle made on first use and destroyed with its owner, after which the owner's stream
// goes (TransformerEngine's HandleManager, per device rather than per process).
class CublasHandle {
 public:
  CublasHandle() = default;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle() { Reset(); }
  // The workspace the handle gets when Get makes it (CublasWorkspaceBytes; 0: cuBLAS's default
  // pool).
  void set_workspace_bytes(std::size_t bytes) { workspace_bytes_ = bytes; }
  // The handle bound to `stream` with its own workspace (cublasSetWorkspace after
  // cublasSetStream, which resets the workspace to the default pool), created on the first call.
  StatusOr<cublasHandle_t> Get(cudaStream_t stream);
  // Destroys the handle now and frees its workspace (a later Get makes new ones); the stream's
  // work must be done.
  void Reset();

 private:
  cublasHandle_t handle_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  void* workspace_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  static StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaPlatformOptions& options);
  ~CudaDevice() override;

  std::string_view name() const override { return name_; }
  DType compute_dtype() const override { return DType::kBF16; }
  bool SupportsFp8() const override { return has_fp8_; }
  Status Synchronize() override;

  Status CopyFromHost(Tensor dst, const void* src, std::size_t bytes) override;
  Status CopyToHost(void* dst, Tensor src, std::size_t bytes) override;
  Status Copy(Tensor dst, Tensor src) override;
  Status CopyRows(Tensor dst, std::int64_t dst_stride, Tensor src, std::int64_t src_stride,
                  std::int64_t rows, std::int64_t cols) override;
  Status Fill(Tensor x, float value) override;
  Status FillHash(Tensor x, const HashFill& fill) override;
  Status Add(Tensor a, Tensor b, Tensor out) override;
  Status Axpy(float alpha, Tensor x, Tensor y) override;
  Status Scale(Tensor x, float alpha) override;
  Status SumSquares(Tensor x, Tensor sum) override;
  Status CheckFinite(Tensor x) override;
  Status DropoutAdd(const DropoutDesc& d, Tensor x, Tensor residual, Tensor out,
                    Tensor mask) override;
  Status DropoutBackward(const DropoutDesc& d, Tensor dy, Tensor mask, Tensor dx) override;

  Status Gemm(const GemmDesc& desc, Tensor a, Tensor b, Tensor c) override;

  Status RmsNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor y, Tensor rstd) override;
  Status RmsNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma, Tensor rstd,
                         Tensor dx, Tensor dgamma) override;
  Status LayerNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor beta, Tensor y,
                          Tensor mean, Tensor rstd) override;
  Status LayerNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma, Tensor mean,
                           Tensor rstd, Tensor dx, Tensor dgamma, Tensor dbeta) override;
  Status RopeForward(const RopeDesc& d, Tensor x, Tensor y) override;
  Status RopeBackward(const RopeDesc& d, Tensor dy, Tensor dx) override;
  Status SwiGluForward(std::int64_t rows, std::int64_t ffn, Tensor x, Tensor y) override;
  Status SwiGluBackward(std::int64_t rows, std::int64_t ffn, Tensor dy, Tensor x,
                        Tensor dx) override;
  Status GeluForward(Tensor x, Tensor y) override;
  Status GeluBackward(Tensor dy, Tensor x, Tensor dx) override;

  Status AttentionForward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse) override;
  Status AttentionBackward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                           Tensor dout, Tensor lse, Tensor dq, Tensor dk, Tensor dv,
                           bool accumulate) override;
  Status AttentionMerge(std::int64_t rows, std::int64_t head_dim, Tensor out, Tensor lse,
                        Tensor part_out, Tensor part_lse) override;
  // Attention runs on cuDNN's fused kernel when DecideSdpa (cudnn_attention_plan.h) and cuDNN
  // accept the call, else on the CUDA-core kernel (kernels/attention_*.cu), which is counted: the
  // note says how many of the attention calls fell back and the first reason.
  std::string AttentionEngineNote() const override;
  // The engine policy; by default AUTOPAR_ATTENTION's, read at the first attention call.
  void SetAttentionEngine(AttentionEngine engine);

  Status CrossEntropyMax(const CrossEntropyDesc& d, Tensor logits, Tensor row_max) override;
  Status CrossEntropyPartials(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                              Tensor row_max, Tensor partials) override;
  Status CrossEntropyLoss(const CrossEntropyDesc& d, Tensor row_max, Tensor partials,
                          Tensor loss) override;
  Status CrossEntropyBackward(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                              Tensor row_max, Tensor partials, Tensor dloss,
                              Tensor dlogits) override;

  Status EmbeddingForward(const EmbeddingDesc& d, Tensor table, Tensor ids, Tensor out) override;
  Status EmbeddingBackward(const EmbeddingDesc& d, Tensor dout, Tensor ids, Tensor dtable) override;

  Status AdamStep(const AdamParams& p, Tensor master, Tensor grad, Tensor exp_avg,
                  Tensor exp_avg_sq, Tensor model) override;

  // The device's use now (cudaMemGetInfo, the pool's unused reserve counted as free) less the
  // tensors: the context, library workspaces, NCCL buffers and the allocator's rounding.
  StatusOr<std::size_t> NonTensorBytes() override;

  // ---- for the NCCL collectives of this device ----
  int index() const { return index_; }
  cudaStream_t stream() const { return stream_; }
  double timeout_s() const { return timeout_s_; }
  // Frees the cuDNN arena, the FP8 workspace and weight copies (tensors of the budget that persist
  // between calls; in stream order, after the work queued on them), waits for the stream
  // (Synchronize), then gives what the tensor pool holds unused back to the driver, so the
  // communicators and workspaces made next can have it. Between trials (RunTrial, before its
  // baseline), not within a step.
  Status ReleaseCachedMemory() override;
  void WeightsChanged() override { fp8_.WeightsChanged(); }
  std::size_t fp8_weight_copies() const { return fp8_.weight_copies(); }
  void SetDeadline(std::chrono::steady_clock::time_point deadline) override;
  // When a wait that began at `started_s` must end (WaitEndS with this device's bounds).
  double wait_end_s(double started_s) const { return WaitEndS(started_s, timeout_s_, deadline_s_); }
  // Makes this device current on the calling thread (CUDA's current device is per thread).
  Status Activate() const;
  // Polls `query` (cudaStreamQuery, cudaEventQuery, ...: cudaSuccess when done, cudaErrorNotReady
  // while pending) until done, a watched communicator fails, or timeout_s passes.
  template <typename Query>
  Status Poll(const char* what, Query&& query);
  void Watch(CommWatch* comm);
  void Unwatch(CommWatch* comm);
  // Makes the compute stream wait for `event` (cudaStreamWaitEvent) without a host wait, and
  // makes every host wait until the next successful Synchronize give up at `deadline` at the
  // latest (the earliest deadline of the work ordered so far), aborting the watched
  // communicators: the stream-ordered request's deadline, enforced where the host does wait.
  Status OrderAfter(cudaEvent_t event, std::chrono::steady_clock::time_point deadline);

 protected:
  StatusOr<void*> AllocateRaw(std::size_t bytes) override;
  void FreeRaw(void* data, std::size_t bytes) override;

 private:
  CudaDevice(const CudaPlatformOptions& options, int index, std::size_t budget_bytes);
  // The tensors' pool, where the device supports memory pools (cudaDevAttrMemoryPoolsSupported).
  Status CreatePool();

  // One idle step of Poll: kCommError (after aborting it) from a failed watched communicator, or
  // kTimeout (after aborting them all) once wait_end_s(started_s) or the deadline of the
  // stream-ordered work has passed; else yields.
  Status CheckWatched(const char* what, double started_s);
  // cudaMemGetInfo's free, plus the pool's reserved-but-unused bytes (PoolAdjustedFreeBytes).
  Status ReadFreeBytes(std::size_t* free_bytes, std::size_t* total_bytes) const;
  // Copies a small device value to the host through pinned memory and waits for it.
  Status ReadScalar(const void* device_src, std::size_t bytes, void* host_dst);
  // The cuDNN side of attention (cuda_layers.cc): true when the call ran on cuDNN, false when the
  // caller must run the CUDA-core kernel (the fallback is then counted with its reason); an error
  // when cuDNN failed while running, or declined under AttentionEngine::kCudnn.
  StatusOr<bool> AttentionOnCudnn(SdpaDirection direction, const AttentionDesc& d, Tensor q,
                                  Tensor k, Tensor v, Tensor out, Tensor dout, Tensor lse,
                                  Tensor dq, Tensor dk, Tensor dv, bool accumulate);
  void CountAttention(const std::string& fallback_reason);  // "" when it ran on cuDNN

  int index_ = 0;
  std::string name_;
  double timeout_s_ = 300.0;
  std::size_t reserve_bytes_ = 0;  // kept free on the device (CudaPlatformOptions)
  // SteadySeconds() by which the work ordered with OrderAfter must be done; +inf when none is
  // pending (cleared by a successful Synchronize, which has waited for all of it).
  double ordered_deadline_s_ = std::numeric_limits<double>::infinity();
  // SteadySeconds() by which every wait must end (SetDeadline); +inf when none.
  double deadline_s_ = std::numeric_limits<double>::infinity();
  int max_smem_optin_ = 48 * 1024;  // shared memory per block a kernel may opt into
  cudaStream_t stream_ = nullptr;
  // The tensors' stream-ordered pool (nullptr on a device without memory pools: cudaMalloc then).
  // It keeps freed blocks for reuse (release threshold: all) until ReleaseCachedMemory.
  cudaMemPool_t pool_ = nullptr;
  CublasHandle cublas_;
  Fp8Gemm fp8_;           // cuBLASLt and its workspace, made on the first FP8 GEMM
  bool has_fp8_ = false;  // compute capability 8.9 or newer (kernels/fp8_scale.h)
  // Device scratch outside the budget, like cuBLAS's workspace: SumSquares partials, then the
  // first non-finite index of CheckFinite.
  void* scratch_ = nullptr;
  void* pinned_ = nullptr;  // 16 bytes of page-locked host memory for ReadScalar
  std::mutex watched_mu_;
  std::vector<CommWatch*> watched_;
  // Attention engine: the policy, cuDNN's state (made on first use; destroyed before cuBLAS and
  // the stream), and the fallback count behind AttentionEngineNote.
  std::optional<AttentionEngine> attention_engine_;
  std::unique_ptr<CudnnAttention> cudnn_attention_;
  std::string cudnn_unavailable_;  // why cuDNN could not be set up, once it failed
  mutable std::mutex attention_note_mu_;
  std::int64_t attention_calls_ = 0;
  std::int64_t attention_fallbacks_ = 0;
  std::string attention_first_fallback_;
};

// The storage of a "compute" argument: bf16 or f32 (kInvalid otherwise), naming op and argument.
StatusOr<kernels::cuda::Storage> ComputeStorage(const char* op, const char* arg, const Tensor& t);

template <typename Query>
Status CudaDevice::Poll(const char* what, Query&& query) {
  const double started_s = SteadySeconds();
  for (;;) {
    const cudaError_t rc = query();
    if (rc == cudaSuccess) return OkStatus();
    if (rc != cudaErrorNotReady) return CudaError(rc, what, __FILE__, __LINE__);
    // Some runtimes record "not ready" as the thread's last error; a later launch check must not
    // mistake it for its own failure.
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    AUTOPAR_RETURN_IF_ERROR(CheckWatched(what, started_s));
  }
}

}  // namespace autopar::device
