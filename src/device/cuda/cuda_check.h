// Checking CUDA runtime, cuBLAS, NCCL and cuDNN calls (TransformerEngine's NVTE_CHECK_CUDA/_CUBLAS/
// _NCCL/_CUDNN, returning a Status instead of throwing).
//
// The outcome follows from the library and the code: an allocation failure is kOom (the trial
// outcome "oom", and the device stays usable), NCCL failures are kCommError, a cuDNN call refused
// as a bad parameter or an unsupported graph is kInvalid, anything else the GPU reports is
// kDeviceError. Messages name the call, the error's name and text, and file:line. The cuDNN parts
// exist when the build found cuDNN (AUTOPAR_HAVE_CUDNN).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
#include <cudnn_graph.h>
#endif

#include "autopar/device/status.h"

namespace autopar::device {

// The Status for a failed call; `call` is its source text.
Status CudaError(cudaError_t rc, const char* call, const char* file, int line);
Status CublasError(cublasStatus_t rc, const char* call, const char* file, int line);
Status NcclError(ncclResult_t rc, const char* call, const char* file, int line);

// The outcome class of each library's codes (exposed for tests).
Outcome CudaOutcome(cudaError_t rc);
Outcome CublasOutcome(cublasStatus_t rc);
Outcome NcclOutcome(ncclResult_t rc);

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
// Adds cudnnGetLastErrorString's detail (which attribute, which check) when there is one.
Status CudnnError(cudnnStatus_t rc, const char* call, const char* file, int line);
Outcome CudnnOutcome(cudnnStatus_t rc);
#endif

}  // namespace autopar::device

#define AUTOPAR_CHECK_CUDA(call)                                                        \
  do {                                                                                  \
    const cudaError_t autopar_cuda_rc_ = (call);                                        \
    if (autopar_cuda_rc_ != cudaSuccess) {                                              \
      return ::autopar::device::CudaError(autopar_cuda_rc_, #call, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

#define AUTOPAR_CHECK_CUBLAS(call)                                                          \
  do {                                                                                      \
    const cublasStatus_t autopar_cublas_rc_ = (call);                                       \
    if (autopar_cublas_rc_ != CUBLAS_STATUS_SUCCESS) {                                      \
      return ::autopar::device::CublasError(autopar_cublas_rc_, #call, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#define AUTOPAR_CHECK_NCCL(call)                                                        \
  do {                                                                                  \
    const ncclResult_t autopar_nccl_rc_ = (call);                                       \
    if (autopar_nccl_rc_ != ncclSuccess) {                                              \
      return ::autopar::device::NcclError(autopar_nccl_rc_, #call, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
#define AUTOPAR_CHECK_CUDNN(call)                                                         \
  do {                                                                                    \
    const cudnnStatus_t autopar_cudnn_rc_ = (call);                                       \
    if (autopar_cudnn_rc_ != CUDNN_STATUS_SUCCESS) {                                      \
      return ::autopar::device::CudnnError(autopar_cudnn_rc_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)
#endif  // AUTOPAR_HAVE_CUDNN
