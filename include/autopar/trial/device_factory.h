// Picks the platform a worker runs trials on: `cpu` (OpenBLAS + MPI) or `cuda` (cuBLAS, kernels/,
// NCCL; only when built with the CUDA toolkit).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "autopar/device/platform.h"

namespace autopar::trial {

// `device_index` picks the GPU (the rank within its node); `p2p_semantics` is the CPU platform's
// (the CUDA platform runs NCCL). A `cuda` request in a build without CUDA, or an unknown name, is
// kInvalid with the allowed names.
device::StatusOr<std::unique_ptr<device::Platform>> MakePlatform(
    const std::string& name, std::size_t memory_budget_bytes, int device_index,
    device::P2PSemantics p2p_semantics = device::P2PSemantics::kMpi);
bool CudaPlatformBuilt();

}  // namespace autopar::trial
