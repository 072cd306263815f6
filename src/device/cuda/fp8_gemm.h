// FP8 GEMMs on the CUDA device through cuBLASLt, with per-tensor current scaling (the scale of each
// operand from its own amax just before the cast: kernels/fp8_scale.h).
//
// Each call quantizes both operands into a workspace of this object's own, in cuBLASLt's TN form
// (fp8_gemm_plan.h), and runs cublasLtMatmul with the operands' scale_inv as
// CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, fp32 accumulation (CUBLAS_COMPUTE_32F), fast
// accumulation only where GemmDesc::fp8_fast_accumulate asks (the forward), writing C in its own
// dtype (bf16 or f32, beta as given). All on the device's stream; the host never waits.
//
// A weight operand (GemmDesc::fp8_b_is_weight) is quantized once per orientation and kept, with
// its scale, until WeightsChanged: the copies Transformer Engine makes at a step's first
// micro-batch and reuses for the rest (the weight and, for the input-gradient GEMM, its transpose;
// 2 bytes per weight on Hopper, what the analytic model counts: Fp8WeightCacheBytes). They are
// device Buffers too, so the trial's peak includes them.
//
// The workspace is a device Buffer (Device::Allocate: the tensor budget, the device's
// stream-ordered pool), as Transformer Engine's fp8 copies and cuBLASLt workspace are PyTorch
// tensors of the training job. It grows by freeing the old one in stream order (cudaFreeAsync:
// the GEMMs queued on it finish first) and allocating anew: no cudaFree, which would wait for the
// whole device, NCCL's side streams included, with no deadline.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "autopar/device/device.h"
#include "autopar/device/ops.h"
#include "autopar/device/status.h"
#include "autopar/device/tensor.h"
#include "kernels/cuda_kernels.cuh"

namespace autopar::device {

class Fp8Gemm {
 public:
  Fp8Gemm() = default;
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  ~Fp8Gemm() { Reset(); }

  // `d` and the views checked by CudaDevice::Gemm (ResolveGemm): a and b of storage `ab_t`
  // (bf16 or f32), c f32 or the same. The workspace comes from `device` (kOom past its budget or
  // reserve); `stream` is the device's compute stream.
  Status Run(Device& device, cudaStream_t stream, const GemmDesc& d, kernels::cuda::Storage ab_t,
             Tensor a, Tensor b, Tensor c);
  // Frees the handle, the workspace and the weights' copies (in the device's stream order).
  void Reset();
  // Frees the workspace and the weights' copies (the next call allocates them again).
  void ReleaseWorkspace() {
    workspace_.Reset();
    WeightsChanged();
  }
  // Drops the weights' FP8 copies (in the device's stream order: GEMMs queued on them finish).
  void WeightsChanged() { weights_.clear(); }
  // How many weight copies are kept.
  std::size_t weight_copies() const { return weights_.size(); }

 private:
  // One quantized view: the source's address and view, the orientation and format it was
  // quantized to; the data, after its Fp8Scales, in `copy`.
  struct WeightCopy {
    const void* source = nullptr;
    std::int64_t rows = 0, cols = 0, ld = 0;
    bool transpose = false;
    Fp8Operand format = Fp8Operand::kNone;
    Buffer copy;
  };
  Status Reserve(Device& device, std::size_t bytes);
  // The kept copy of the weight view b (quantized now if there is none): its scales and data.
  StatusOr<const WeightCopy*> WeightOperand(Device& device, cudaStream_t stream,
                                            kernels::cuda::Storage t, const void* b,
                                            std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                            bool transpose, Fp8Operand format);

  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  std::vector<WeightCopy> weights_;
};

}  // namespace autopar::device
