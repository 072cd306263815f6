#include "autopar/device/group.h"

#include <cstdio>
#include <string>
#include <utility>

#include "autopar/device/mpi_check.h"

namespace autopar::device {
namespace {

// MPI_Comm_create_group tag; creations on one rank are sequential, so one tag suffices.
constexpr int kCreateGroupTag = 0x4150;  // "AP"

Status CheckMpiInitialized() {
  int initialized = 0;
  int finalized = 0;
  AUTOPAR_CHECK_MPI(MPI_Initialized(&initialized));
  AUTOPAR_CHECK_MPI(MPI_Finalized(&finalized));
  AUTOPAR_CHECK_ARG(initialized && !finalized, "MPI is not initialized (or already finalized)");
  return OkStatus();
}

// World ranks of every member of `comm`, by group rank.
Status TranslateToWorld(MPI_Comm comm, int size, std::vector<int>* world_ranks) {
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  AUTOPAR_CHECK_MPI(MPI_Comm_group(comm, &group));
  std::vector<int> ranks(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) ranks[i] = i;
  world_ranks->assign(static_cast<std::size_t>(size), MPI_UNDEFINED);
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks->data());
  }
  // Free both handles whatever happened above, then report the first failure.
  const int rc_free_group = MPI_Group_free(&group);
  const int rc_free_world = world != MPI_GROUP_NULL ? MPI_Group_free(&world) : MPI_SUCCESS;
  AUTOPAR_CHECK_MPI(rc);
  AUTOPAR_CHECK_MPI(rc_free_group);
  AUTOPAR_CHECK_MPI(rc_free_world);
  return OkStatus();
}

}  // namespace

Group::Group(Group&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)),
      world_ranks_(std::move(other.world_ranks_)) {}

Group& Group::operator=(Group&& other) noexcept {
  if (this != &other) {
    Free();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
    world_ranks_ = std::move(other.world_ranks_);
  }
  return *this;
}

Group::~Group() { Free(); }

void Group::Free() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  // After MPI_Finalize the handle is dead and freeing it is erroneous; a destructor cannot return
  // a status, so a failure is reported on stderr.
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
    const int rc = MPI_Comm_free(&comm_);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "%s\n",
                   MpiError(rc, "MPI_Comm_free", __FILE__, __LINE__).ToString().c_str());
    }
  }
  comm_ = MPI_COMM_NULL;
  rank_ = -1;
  size_ = 0;
  world_ranks_.clear();
}

StatusOr<Group> Group::Adopt(MPI_Comm comm) {
  Group group;
  if (comm == MPI_COMM_NULL) return group;
  group.comm_ = comm;  // owned from here on, so every error path below frees it
  AUTOPAR_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  AUTOPAR_CHECK_MPI(MPI_Comm_rank(comm, &group.rank_));
  AUTOPAR_CHECK_MPI(MPI_Comm_size(comm, &group.size_));
  AUTOPAR_RETURN_IF_ERROR(TranslateToWorld(comm, group.size_, &group.world_ranks_));
  return group;
}

StatusOr<Group> Group::World() {
  AUTOPAR_RETURN_IF_ERROR(CheckMpiInitialized());
  MPI_Comm comm = MPI_COMM_NULL;
  AUTOPAR_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return Adopt(comm);
}

StatusOr<Group> Group::Split(int color, int key) const {
  AUTOPAR_CHECK_ARG(!empty(), "Split on an empty group");
  MPI_Comm comm = MPI_COMM_NULL;
  AUTOPAR_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &comm));
  return Adopt(comm);
}

StatusOr<Group> Group::Subgroup(std::span<const int> ranks) const {
  AUTOPAR_CHECK_ARG(!empty(), "Subgroup of an empty group");
  std::vector<bool> seen(static_cast<std::size_t>(size_), false);
  bool includes_me = false;
  for (int r : ranks) {
    AUTOPAR_CHECK_ARG(r >= 0 && r < size_ && !seen[r],
                      "Subgroup: rank " + std::to_string(r) + " is out of range or repeated");
    seen[r] = true;
    includes_me = includes_me || r == rank_;
  }
  AUTOPAR_CHECK_ARG(includes_me, "Subgroup: called by rank " + std::to_string(rank_) +
                                     ", which is not in the list");
  MPI_Group parent = MPI_GROUP_NULL;
  MPI_Group sub = MPI_GROUP_NULL;
  AUTOPAR_CHECK_MPI(MPI_Comm_group(comm_, &parent));
  int rc = MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &sub);
  MPI_Comm comm = MPI_COMM_NULL;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(comm_, sub, kCreateGroupTag, &comm);
  const int rc_free_parent = MPI_Group_free(&parent);
  const int rc_free_sub = sub != MPI_GROUP_NULL ? MPI_Group_free(&sub) : MPI_SUCCESS;
  StatusOr<Group> group = Adopt(comm);  // owns comm even if a later check fails
  AUTOPAR_CHECK_MPI(rc);
  AUTOPAR_CHECK_MPI(rc_free_parent);
  AUTOPAR_CHECK_MPI(rc_free_sub);
  return group;
}

StatusOr<Group> Group::Duplicate() const {
  AUTOPAR_CHECK_ARG(!empty(), "Duplicate of an empty group");
  MPI_Comm comm = MPI_COMM_NULL;
  AUTOPAR_CHECK_MPI(MPI_Comm_dup(comm_, &comm));
  return Adopt(comm);
}

}  // namespace autopar::device
