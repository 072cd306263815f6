// The CUDA backend: a CudaDevice plus NCCL collectives over its memory.
#include "autopar/backend/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "src/backend/cuda/cuda_device.h"
#include "src/backend/cuda/nccl_collectives.h"

namespace autopar::backend {
namespace {

// The node-local rank the common launchers export; 0 when launched otherwise.
int LocalRank() {
  for (const char* variable :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    if (*end == '\0' && rank >= 0) return static_cast<int>(rank);
  }
  return 0;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(std::unique_ptr<CudaDevice> device) : device_(std::move(device)) {}

  std::string_view name() const override { return "cuda"; }
  Device& device() override { return *device_; }
  StatusOr<std::unique_ptr<Collectives>> Connect(const Group& group) override {
    return MakeNcclCollectives(*device_, group);
  }

 private:
  std::unique_ptr<CudaDevice> device_;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: an answer, not an error to carry along
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    const std::string why = rc != cudaSuccess
                                ? CudaError(rc, "cudaGetDeviceCount", __FILE__, __LINE__).message()
                                : std::string("no CUDA device is visible");
    return Status::Error(Outcome::kDeviceError, "CUDA backend unavailable: " + why, __FILE__,
                         __LINE__);
  }
  CudaBackendOptions resolved = options;
  if (resolved.device_index < 0) resolved.device_index = LocalRank() % count;
  if (resolved.device_index >= count) {
    return Status::Error(Outcome::kDeviceError,
                         "CUDA device " + std::to_string(resolved.device_index) + " requested; " +
                             std::to_string(count) + " visible",
                         __FILE__, __LINE__);
  }
  AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(resolved));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(std::move(device)));
}

}  // namespace autopar::backend
