#include "src/device/cuda/cuda_check.h"

#include <string>

namespace autopar::device {

Outcome CudaOutcome(cudaError_t rc) {
  switch (rc) {
    case cudaSuccess:
      return Outcome::kOk;
    case cudaErrorMemoryAllocation:
      return Outcome::kOom;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return Outcome::kInvalid;
    default:
      return Outcome::kDeviceError;
  }
}

Outcome CublasOutcome(cublasStatus_t rc) {
  switch (rc) {
    case CUBLAS_STATUS_SUCCESS:
      return Outcome::kOk;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return Outcome::kOom;
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return Outcome::kInvalid;
    default:
      return Outcome::kDeviceError;
  }
}

Outcome NcclOutcome(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess:
      return Outcome::kOk;
    case ncclUnhandledCudaError:
      return Outcome::kDeviceError;
    default:  // system, internal, remote, usage errors: the transport failed
      return Outcome::kCommError;
  }
}

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
Outcome CudnnOutcome(cudnnStatus_t rc) {
  if (rc == CUDNN_STATUS_SUCCESS) return Outcome::kOk;
  if (rc == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      rc == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return Outcome::kOom;
  }
  // cuDNN 9 groups its codes by the thousand: 2xxx bad parameters, 3xxx not supported.
  const int category = static_cast<int>(rc) / 1000 * 1000;
  if (category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED) {
    return Outcome::kInvalid;
  }
  return Outcome::kDeviceError;
}
#endif

Status CudaError(cudaError_t rc, const char* call, const char* file, int line) {
  // The runtime also keeps `rc` as this thread's last error; a later launch check would report it
  // again, so take it off now. Sticky errors (a faulted context) stay, as they must.
  (void)cudaGetLastError();
  return Status::Error(
      CudaOutcome(rc),
      std::string(call) + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc), file,
      line);
}

Status CublasError(cublasStatus_t rc, const char* call, const char* file, int line) {
  return Status::Error(
      CublasOutcome(rc),
      std::string(call) + " failed: " + cublasGetStatusName(rc) + ": " + cublasGetStatusString(rc),
      file, line);
}

Status NcclError(ncclResult_t rc, const char* call, const char* file, int line) {
  // ncclGetLastError carries the detail (which peer, which system call) of the latest failure.
  const char* detail = ncclGetLastError(nullptr);
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(rc);
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  return Status::Error(NcclOutcome(rc), message, file, line);
}

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
Status CudnnError(cudnnStatus_t rc, const char* call, const char* file, int line) {
  // cuDNN's own text for the latest failure on this thread: which descriptor check refused.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = std::string(call) + " failed: " + cudnnGetErrorString(rc);
  if (detail[0] != '\0') message += std::string(" (") + detail + ")";
  return Status::Error(CudnnOutcome(rc), message, file, line);
}
#endif

}  // namespace autopar::device
