// The CUDA platform: a CudaDevice plus NCCL collectives over its memory.
#include "autopar/device/cuda_platform.h"

#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "autopar/device/mpi_check.h"
#include "src/device/comm_cache.h"
#include "src/device/cuda/cuda_device.h"
#include "src/device/cuda/nccl_collectives.h"
#include "src/device/cuda/nccl_comm.h"

namespace autopar::device {
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

class CudaPlatform final : public Platform {
 public:
  explicit CudaPlatform(std::unique_ptr<CudaDevice> device) : device_(std::move(device)) {}
  ~CudaPlatform() override {
    groups_.Clear();  // the children before the world communicator they were split from
    world_.reset();
  }

  std::string_view name() const override { return "cuda"; }
  Device& device() override { return *device_; }
  StatusOr<std::unique_ptr<Collectives>> Connect(const Group& group) override {
    return MakeNcclCollectives(*device_, group);
  }
  StatusOr<std::unique_ptr<Collectives>> ConnectSplit(const Group& world,
                                                      const Group& group) override;
  // Split groups hold buffers of their own (NcclCommConfig: splitShare = 0): those of earlier
  // configurations go, so NonTensorBytes and the reserve check see only this one's.
  void RetainGroups(std::span<const std::vector<int>> member_sets) override {
    groups_.RetainOnly(member_sets);
  }

 private:
  // Declared in this order so the communicators go before the device, children first.
  std::unique_ptr<CudaDevice> device_;
  std::vector<int> world_members_;   // world ranks of world_
  std::shared_ptr<NcclComm> world_;  // the parent of every group
  MemberSetCache<NcclComm> groups_;  // split from world_, keyed by their world ranks
};

// The protocol, every world rank in the same order:
//  a. Each rank states whether its family (world communicator and cached groups) is unusable:
//     missing, over other ranks, or with any member aborted (its peers' halves are in an unknown
//     state, so the whole family is rebuilt); and
//     whether its group needs a communicator it has not cached.
//  b. One host all-reduce (MAX) over `world` makes both answers the job's.
//  c. If any family is unusable, every rank aborts and drops its family and makes a new world
//     communicator, so no rank splits from a parent its peers have given up. Aborted, not
//     finalized: ncclCommFinalize waits for the communicator's outstanding work on its streams
//     (NCCL src/init.cc, commDestroySync), which a peer that aborted its half may never let
//     finish, while ncclCommAbort is local and bounded; NCCL's user guide (fault tolerance) has
//     every rank abort once any rank has failed.
//  d. If any group needs a communicator (or (c) made a new family), every rank synchronizes its
//  device (a split needs the
//     parent idle) and calls ncclCommSplit: a rank whose group needs one passes the group's
//     color (its lowest world rank) and its group rank as key, the others NCCL_SPLIT_NOCOLOR.
//     All members of a group reach the same answer in (a), since they built and cached it
//     together, so the members of one group all pass its color.
//  e. The rank returns collectives over the cached (or world) communicator: no NCCL set-up when
//     (c) and (d) did nothing.
StatusOr<std::unique_ptr<Collectives>> CudaPlatform::ConnectSplit(const Group& world,
                                                                  const Group& group) {
  AUTOPAR_CHECK_ARG(!world.empty(), "ConnectSplit: empty world group");
  const std::vector<int>& members = group.world_ranks();
  const bool whole_world = !group.empty() && members == world.world_ranks();
  // (a)
  const bool family_unusable = world_ == nullptr || world_members_ != world.world_ranks() ||
                               world_->aborted() ||
                               groups_.Any([](const NcclComm& comm) { return comm.aborted(); });
  const bool need_split = !group.empty() && !whole_world && groups_.Find(members) == nullptr;
  // (b)
  int flags[2] = {family_unusable ? 1 : 0, need_split ? 1 : 0};
  AUTOPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, world.comm()));
  // (c)
  if (flags[0] != 0) {
    groups_.ForEach([](NcclComm& comm) { comm.Abort(); });  // children before their parent
    if (world_ != nullptr) world_->Abort();
    groups_.Clear();
    world_.reset();
    world_members_.clear();
    AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> made, NcclComm::Create(*device_, world));
    world_ = std::move(made);
    world_members_ = world.world_ranks();
  }
  // (d) A new family has no groups yet: every rank that needs one splits it again.
  if (flags[0] != 0 || flags[1] != 0) {
    AUTOPAR_RETURN_IF_ERROR(device_->Synchronize());
    const bool mine = !group.empty() && !whole_world && groups_.Find(members) == nullptr;
    AUTOPAR_ASSIGN_OR_RETURN(
        std::unique_ptr<NcclComm> child,
        NcclComm::Split(*world_, mine ? SplitColor(members) : -1, mine ? group.rank() : 0));
    if (mine) {
      if (child == nullptr || child->size() != group.size() || child->rank() != group.rank()) {
        // The ranks' caches disagreed about this group: rebuild the whole family next time.
        world_->Abort();
        return Status::Error(Outcome::kCommError,
                             "ncclCommSplit made a communicator that does not match the MPI group",
                             __FILE__, __LINE__);
      }
      groups_.Insert(members, std::move(child));
    }
  }
  // (e)
  if (group.empty()) return std::unique_ptr<Collectives>();
  if (whole_world) return MakeNcclCollectives(world_);
  std::shared_ptr<NcclComm> comm = groups_.Find(members);
  if (comm == nullptr) {
    return Status::Error(Outcome::kCommError, "no communicator for the group after the split",
                         __FILE__, __LINE__);
  }
  return MakeNcclCollectives(std::move(comm));
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: an answer, not an error to carry along
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<Platform>> MakeCudaPlatform(const CudaPlatformOptions& options) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    const std::string why = rc != cudaSuccess
                                ? CudaError(rc, "cudaGetDeviceCount", __FILE__, __LINE__).message()
                                : std::string("no CUDA device is visible");
    return Status::Error(Outcome::kDeviceError, "CUDA backend unavailable: " + why, __FILE__,
                         __LINE__);
  }
  CudaPlatformOptions resolved = options;
  if (resolved.device_index < 0) resolved.device_index = LocalRank() % count;
  if (resolved.device_index >= count) {
    return Status::Error(Outcome::kDeviceError,
                         "CUDA device " + std::to_string(resolved.device_index) + " requested; " +
                             std::to_string(count) + " visible",
                         __FILE__, __LINE__);
  }
  AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(resolved));
  return std::unique_ptr<Platform>(std::make_unique<CudaPlatform>(std::move(device)));
}

}  // namespace autopar::device
