// Collectives over NCCL on the CUDA device's memory: the CUDA platform's transport.
#pragma once

#include <memory>

#include "autopar/device/collectives.h"
#include "autopar/device/group.h"
#include "src/device/cuda/cuda_device.h"
#include "src/device/cuda/nccl_comm.h"

namespace autopar::device {

// A non-blocking NCCL communicator over `group` (collective over its members): rank 0 makes the
// unique id and broadcasts it over the group's MPI communicator, then every member polls
// ncclCommInitRankConfig to completion or `device.timeout_s()`. The result watches itself through
// `device` (so the device's waits notice its failures) and must be destroyed before `device`; its
// requests refer to it and must be destroyed before it.
StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(CudaDevice& device, const Group& group);

// Collectives over an existing communicator, which they share (the CUDA platform's cache holds
// another reference); `comm` must not be null.
std::unique_ptr<Collectives> MakeNcclCollectives(std::shared_ptr<NcclComm> comm);

}  // namespace autopar::device
