// FP8 GEMMs on the CUDA device through cuBLASLt, with per-tensor current scaling (the scale of each
// operand from its own amax just before the cast: kernels/fp8_scale.h).
//
// Each call quantizes both operands into a workspace of this object's own, in cuBLASLt's TN form
// (fp8_gemm_plan.h), and runs cublasLtMatmul with the operands' scale_inv as
// CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, fp32 accumulation (CUBLAS_COMPUTE_32F), fast
// accumulation only where GemmDesc::fp8_fast_accumulate asks (the forward), writing C in its own
// dtype (bf16 or f32, beta as given). All on the device's stream; the host never waits.
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
  // Frees the handle and the workspace (in the device's stream order).
  void Reset();
  // Frees the workspace only (the next call allocates it again).
  void ReleaseWorkspace() { workspace_.Reset(); }

 private:
  Status Reserve(Device& device, std::size_t bytes);

  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
};

}  // namespace autopar::device
