// cuDNN's fused flash attention (SDPA) through the backend graph API, for the CUDA device's
// AttentionForward/AttentionBackward (contracts in autopar/device/device.h and ops.h).
//
// One object per device: a cudnnHandle_t bound to the device's compute stream, a cache of
// finalized execution plans keyed by SdpaKey (cudnn_attention_plan.h; the graphs are in
// cudnn_sdpa_graph.h, cudnn-frontend's SDPA lowering; built on first use, a graph
// cuDNN refuses is remembered as declined with cuDNN's reason), and one scratch arena for cuDNN's
// workspace and the call's temporaries, taken from the device's budgeted allocator so it counts in
// bytes_in_use and peak_bytes. The arena only grows and is kept for later calls, like a framework's
// cached workspace; growing it first waits for the stream (queued work may still use the old one).
//
// Layouts and conventions match the CUDA-core kernel exactly:
//  * q, k, v, out, dout, dq, dk, dv are our [s, b, h, d] rows with their strides; cuDNN is given
//    [b, h, s, d] dims with matching strides, so nothing is copied.
//  * cuDNN's stats are the natural-log log-sum-exp of the scaled scores, max + log(sum exp(s -
//    max)), like ours, but laid out [b, h_q, s_q]. The forward writes them to the arena and
//    transposes them into lse [s_q, b, h_q] (cublasSgeam); the backward transposes lse back.
//  * The backward overwrites the head slots of dq, dk, dv (cuDNN writes through their strides and
//    leaves the rest of a fused row alone). With `accumulate` cuDNN writes into zeroed copies in
//    the arena of the same extent and strides, and those are added in with the device's bf16 Axpy:
//    the columns cuDNN did not write add +0, which leaves every bf16 value as it was.
//
// Every cuDNN call is checked (AUTOPAR_CHECK_CUDNN). Building a plan never fails a call: any
// refusal there becomes a decline and the caller runs the CUDA-core kernel. Running a built plan
// can fail like any other kernel (kDeviceError, kOom for the arena).
//
// Without cuDNN in the build (AUTOPAR_HAVE_CUDNN unset) Create returns kInvalid and the device
// only ever runs the kernel.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "autopar/device/status.h"
#include "autopar/device/tensor.h"
#include "src/device/cuda/cudnn_attention_plan.h"

namespace autopar::device {

class CudnnAttention {
 public:
  // The device's budgeted allocator (Device::Allocate(bytes)).
  using Allocator = std::function<StatusOr<Buffer>(std::size_t bytes)>;
  // Waits until everything enqueued on the stream is done (Device::Synchronize).
  using Waiter = std::function<Status()>;

  // The handle is bound to `stream`; `cublas` (bound to the same stream) transposes the stats.
  // Both must outlive this object.
  static StatusOr<std::unique_ptr<CudnnAttention>> Create(cudaStream_t stream,
                                                          cublasHandle_t cublas, Allocator allocate,
                                                          Waiter wait);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // What a call did: ran on cuDNN, or ran nothing because cuDNN declined the graph (why_not says
  // why, in cuDNN's words), so the caller must run the kernel instead.
  struct Attempt {
    bool ran = false;
    std::string why_not;
  };

  // key.direction must be kForward. out: packed [s_q, b, h_q, d]; lse: [s_q, b, h_q] f32.
  StatusOr<Attempt> Forward(const SdpaKey& key, float scale, const void* q, const void* k,
                            const void* v, void* out, float* lse);
  // key.direction must be kBackward; out and lse are the FINAL ones (after any merges).
  StatusOr<Attempt> Backward(const SdpaKey& key, float scale, const void* q, const void* k,
                             const void* v, const void* out, const void* dout, const float* lse,
                             void* dq, void* dk, void* dv, bool accumulate);

  // Plans built so far (including declined ones), for tests.
  std::size_t cached_plans() const;
  // Frees the scratch arena (stream-ordered, so queued work on it finishes first); the next call
  // allocates it again. The plans stay cached.
  void ReleaseArena();
  std::size_t arena_bytes() const;

  // The loaded cuDNN's cudnnGetVersion() (DecideSdpa's version rules); 0 without cuDNN.
  static std::int64_t LibraryVersion();

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace autopar::device
