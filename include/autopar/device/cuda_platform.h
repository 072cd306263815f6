// The CUDA platform: one GPU (cudaMalloc under the budget, one compute stream, bf16 compute,
// cuBLAS GEMMs with fp32 accumulation, the kernels of kernels/*.cu) plus NCCL collectives.
//
// Declared only when the build found CUDA and NCCL: the device library then defines
// AUTOPAR_HAVE_CUDA=1 for every consumer, so callers write
//
//   #if AUTOPAR_HAVE_CUDA
//     CudaPlatformOptions options{.device_index = local_rank, .memory_budget_bytes = budget};
//     StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(options);
//   #endif
//
// Differences from the CPU platform a caller can observe:
//  * Ops are enqueued on the device's stream and return at once; errors a kernel meets while
//    running show up at the next Synchronize or host copy (as kDeviceError). Synchronize, the host
//    copies, Request::Wait and Barrier poll the stream rather than block in the driver, and on
//    the way ask every live NCCL communicator of the device for its asynchronous error; past
//    timeout_s, or past the deadline of Device::SetDeadline (a trial's) if that comes first, they
//    abort those communicators (ncclCommAbort) and return kTimeout, so a dead peer cannot hang
//    the worker (nccl-tests' testStreamSynchronize).
//  * "compute" arguments may be bf16 (compute_dtype()) or f32, all alike within one call; f32 is
//    what tests use to check the kernels' index math tightly against the host references.
//  * Copy also converts between f32 and bf16 (round to nearest even), e.g. master -> model weights.
//  * Blocking collectives are stream-ordered on the compute stream (later ops see their result,
//    the host does not wait); the I* variants run on a side stream and overlap with compute until
//    Wait/Test, or until the compute stream reaches Request::OrderOnDevice's wait for them
//    (Collectives::stream_ordered() is true), which costs the host nothing. NCCL has no tags:
//    point-to-point messages between a pair match in issue order, and a size mismatch between
//    sender and receiver is not detected. Reductions work on f32, bf16, f16 and i32. NCCL cannot
//    cancel one operation, so Request::Abandon aborts the whole communicator (later calls on it are
//    kCommError).
//  * Ids (embedding, cross-entropy targets) are not range-checked on the host, which would cost a
//    device-to-host copy per call; a negative id acts like one outside the vocabulary shard.
//  * Collectives keep a pointer to their platform's device: destroy them before the platform.
//  * Communicators are built once: ConnectSplit makes one world communicator (splitShare=1) and
//    splits every group from it with ncclCommSplit, cached by the group's world ranks, so a later
//    trial's group over the same ranks costs no NCCL set-up. A failure that aborted any of them
//    (they share resources, so one abort can break the others) makes the next ConnectSplit
//    rebuild them all, on every rank alike. Connect(group) builds a communicator of its own.
//  * Memory: tensors may take min(memory_budget_bytes, total − memory_reserve_bytes), and no
//    allocation may leave less than memory_reserve_bytes free on the device (what the context,
//    cuBLAS and NCCL hold counts); NonTensorBytes() is the process's device memory (cudaMemGetInfo)
//    less its tensors (the CUDA context included).
#pragma once

#include <cstddef>
#include <limits>
#include <memory>

#include "autopar/device/platform.h"

#if defined(AUTOPAR_HAVE_CUDA) && AUTOPAR_HAVE_CUDA

namespace autopar::device {

struct CudaPlatformOptions {
  // CUDA device ordinal; negative: the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK,
  // MPI_LOCALRANKID, SLURM_LOCALID or LOCAL_RANK, else 0) modulo the number of devices.
  int device_index = -1;
  // Per-rank budget; allocations past it, or that cudaMalloc refuses, are kOom.
  std::size_t memory_budget_bytes = std::numeric_limits<std::size_t>::max();
  // Device memory kept free (see device_memory.h for why and the default's origin): the tensor
  // budget is at most the device's total less this, and an allocation that would leave less free
  // is kOom.
  std::size_t memory_reserve_bytes = std::size_t{1} << 30;
  // Bound of one wait: Synchronize, a host copy, Request::Wait, communicator set-up; a trial's
  // deadline (Device::SetDeadline) ends a wait earlier.
  double timeout_s = 300.0;
};

// kDeviceError when there is no usable GPU (no driver, no device, bad ordinal).
StatusOr<std::unique_ptr<Platform>> MakeCudaPlatform(const CudaPlatformOptions& options);

// Visible CUDA devices; 0 (never an error) when the driver or the devices are missing, so tests
// and the CLI can decide to skip or fall back to the CPU platform.
int CudaDeviceCount();

}  // namespace autopar::device

#endif  // AUTOPAR_HAVE_CUDA
