#include "autopar/trial/device_factory.h"

#if defined(AUTOPAR_HAVE_CUDA)
#include "autopar/device/cuda_platform.h"
#endif

namespace autopar::trial {

bool CudaPlatformBuilt() {
#if defined(AUTOPAR_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

device::StatusOr<std::unique_ptr<device::Platform>> MakePlatform(
    const std::string& name, std::size_t memory_budget_bytes, int device_index,
    device::P2PSemantics p2p_semantics) {
  if (name == "cpu") {
    device::CpuPlatformOptions options;
    options.memory_budget_bytes = memory_budget_bytes;
    options.p2p_semantics = p2p_semantics;
    return device::MakeCpuPlatform(options);
  }
  if (name == "cuda") {
#if defined(AUTOPAR_HAVE_CUDA)
    device::CudaPlatformOptions options;
    options.device_index = device_index;
    options.memory_budget_bytes = memory_budget_bytes;
    return device::MakeCudaPlatform(options);
#else
    (void)device_index;
    return device::Status(device::Outcome::kInvalid,
                          "--backend cuda: this build has no CUDA toolkit; allowed: cpu");
#endif
  }
  return device::Status(device::Outcome::kInvalid,
                        "--backend: unknown backend '" + name + "'; allowed: cpu, cuda");
}

}  // namespace autopar::trial
