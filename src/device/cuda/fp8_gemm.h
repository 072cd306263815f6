// FP8 GEMMs on the CUDA device through cuBLASLt, with per-tensor current scaling (the scale of each
// operand from its own amax just before the cast: kernels/fp8_scale.h).
//
// Each call quantizes both operands into a workspace of this object's own (outside the tensor
// budget, like cuBLAS's workspace, so it shows in Device::NonTensorBytes), in cuBLASLt's TN form
// (fp8_gemm_plan.h), and runs cublasLtMatmul with the operands' scale_inv as
// CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, fp32 accumulation (CUBLAS_COMPUTE_32F) without fast
// accumulation, writing C in its own dtype (bf16 or f32, beta as given). All on the device's
// stream; the host never waits.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

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
  // (bf16 or f32), c f32 or the same. A workspace that must grow is only grown when the device
  // keeps `reserve_bytes` free afterwards (else kOom).
  Status Run(cudaStream_t stream, const GemmDesc& d, kernels::cuda::Storage ab_t, Tensor a,
             Tensor b, Tensor c, std::size_t reserve_bytes);
  // Frees the handle and the workspace (waits for the device: cudaFree).
  void Reset();

 private:
  Status Reserve(std::size_t bytes, std::size_t reserve_bytes);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace autopar::device
