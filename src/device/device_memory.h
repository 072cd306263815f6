// Device memory as a training job sees it: the budget a trial may fill and what the process holds
// besides its tensors. Pure and header-only, so the host tests check the arithmetic.
//
// A real job's peak is not only its tensors: the CUDA context, cuBLAS/cuBLASLt workspaces, NCCL's
// communicator buffers and the allocator's rounding take device memory too, and a configuration
// that fits its tensors into the whole device still fails in training. So the budget is the
// device's total less a reserve, and the non-tensor bytes are measured (cudaMemGetInfo) rather
// than assumed.
#pragma once

#include <algorithm>
#include <cstddef>

namespace autopar::device {

// What a trial leaves free by default: PyTorch's caching allocator fragments, and the real job
// keeps memory a trial does not (checkpoint buffers, the data loader's pinned staging); 1 GiB is
// what Megatron users commonly leave on an 80 GB device.
inline constexpr std::size_t kDefaultMemoryReserveBytes = std::size_t{1} << 30;

// The tensor budget: `requested_bytes` capped by the device's total less the reserve (0 when the
// reserve exceeds the device).
constexpr std::size_t DeviceBudgetBytes(std::size_t total_bytes, std::size_t reserve_bytes,
                                        std::size_t requested_bytes) {
  const std::size_t usable = total_bytes > reserve_bytes ? total_bytes - reserve_bytes : 0;
  return std::min(usable, requested_bytes);
}

// Whether taking `bytes` more out of `free_bytes` (cudaMemGetInfo's free) leaves the reserve.
constexpr bool LeavesReserve(std::size_t free_bytes, std::size_t bytes, std::size_t reserve_bytes) {
  return bytes <= free_bytes && free_bytes - bytes >= reserve_bytes;
}

// What is free for this process's next tensor: cudaMemGetInfo's free plus what its own
// stream-ordered pool holds reserved but unused (cudaMemPoolAttrReservedMemCurrent less
// cudaMemPoolAttrUsedMemCurrent). cudaMemGetInfo counts a pool's reserved memory as used, but the
// pool hands freed blocks out again without asking the driver, so between a cudaFreeAsync and the
// pool's trim that memory is still the process's to allocate (and is not overhead).
constexpr std::size_t PoolAdjustedFreeBytes(std::size_t free_bytes, std::size_t pool_reserved_bytes,
                                            std::size_t pool_used_bytes) {
  return free_bytes +
         (pool_reserved_bytes > pool_used_bytes ? pool_reserved_bytes - pool_used_bytes : 0);
}

// Bytes the process holds on the device besides its tensors: the device's use now
// (total − free) less its use when the process started less the tensors allocated; 0 if the
// figures say less (another process freed memory meanwhile).
constexpr std::size_t NonTensorBytes(std::size_t total_bytes, std::size_t free_bytes,
                                     std::size_t used_at_start_bytes, std::size_t tensor_bytes) {
  const std::size_t used = total_bytes > free_bytes ? total_bytes - free_bytes : 0;
  const std::size_t ours = used > used_at_start_bytes ? used - used_at_start_bytes : 0;
  return ours > tensor_bytes ? ours - tensor_bytes : 0;
}

}  // namespace autopar::device
