// A platform: one device plus the way to build collectives over process groups on it (what
// `--backend cpu|cuda` selects for the trial runner).
//
// The trial runner is written against this interface; `MakeCpuPlatform` gives OpenBLAS + MPI, and
// the CUDA platform (cuBLAS + kernels/ + NCCL, cuda_platform.h) implements the same one.
// Collectives are made per group because an NCCL communicator is bound to both a device and a
// group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "autopar/device/collectives.h"
#include "autopar/device/device.h"
#include "autopar/device/group.h"
#include "autopar/device/p2p_semantics.h"
#include "autopar/device/status.h"

namespace autopar::device {

class Platform {
 public:
  virtual ~Platform() = default;
  virtual std::string_view name() const = 0;
  virtual Device& device() = 0;
  // Collective over the members of `group`; an empty group is kInvalid. The result keeps its own
  // communicator, so it may outlive `group`.
  virtual StatusOr<std::unique_ptr<Collectives>> Connect(const Group& group) = 0;
  // Collective over `world` (every world rank calls it, in the same order): the collectives of
  // `group`, this rank's group from a split of `world`, or nullptr where `group` is empty (the
  // rank is in none). A platform that builds groups by splitting one world communicator (CUDA:
  // ncclCommSplit) needs every world rank in the call, and caches them by their members so a
  // later call for the same ranks reuses one; the default connects `group` alone.
  virtual StatusOr<std::unique_ptr<Collectives>> ConnectSplit(const Group& world,
                                                              const Group& group) {
    (void)world;
    if (group.empty()) return std::unique_ptr<Collectives>();
    return Connect(group);
  }
  // Local, after a configuration's ConnectSplit calls: `member_sets` are the world ranks
  // (Group::world_ranks()) of every group this rank connected for it. A platform that caches
  // communicators across calls drops the others, so the device holds only the buffers of the
  // groups the configuration uses, as the real job does. Consistent over a group's members, since
  // a group of a configuration is one of every member's groups. The default caches nothing.
  virtual void RetainGroups(std::span<const std::vector<int>> member_sets) { (void)member_sets; }
};

struct CpuPlatformOptions {
  // Per-rank device memory budget (`--device-memory-gib`); allocations past it are kOom.
  std::size_t memory_budget_bytes = std::numeric_limits<std::size_t>::max();
  // OpenBLAS threads; 1 keeps ranks sharing a host from oversubscribing its cores.
  int blas_threads = 1;
  // Tile sizes of the blockwise attention: memory is O(block_q * block_kv) per call.
  std::int64_t attention_block_q = 64;
  std::int64_t attention_block_kv = 64;
  P2PSemantics p2p_semantics = P2PSemantics::kMpi;
};

// fp32 compute on the host; no MPI call is made until Connect.
StatusOr<std::unique_ptr<Platform>> MakeCpuPlatform(const CpuPlatformOptions& options);

}  // namespace autopar::device
