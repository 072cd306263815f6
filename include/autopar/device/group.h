// A process group: an MPI communicator owned by RAII.
//
// Groups are the control plane of every platform: the CPU platform runs its collectives on (a
// duplicate of) the group's communicator; the CUDA platform uses it to agree on an NCCL unique id.
// Every communicator made here has MPI_ERRORS_RETURN, so failures come back as kCommError.
//
// Creation is collective. World() over all ranks; Split() over the members of the parent group;
// Subgroup() only over the ranks it lists, which must all call it with the same list, and ranks
// that share several groups must create them in the same order.
#pragma once

#include <mpi.h>

#include <span>
#include <vector>

#include "autopar/device/status.h"

namespace autopar::device {

class Group {
 public:
  Group() = default;  // empty: not a member of any group
  Group(Group&& other) noexcept;
  Group& operator=(Group&& other) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();  // MPI_Comm_free, unless MPI is already finalized

  // A duplicate of MPI_COMM_WORLD, so our error handler and tags stay off the world communicator.
  static StatusOr<Group> World();

  // MPI_Comm_split: members with the same color form a group, ordered by (key, parent rank).
  // A negative color leaves this rank out: it gets an empty group.
  StatusOr<Group> Split(int color, int key) const;

  // The group of the listed ranks of this group, in the listed order (on World(), the list is of
  // world ranks). Called by the listed ranks only.
  StatusOr<Group> Subgroup(std::span<const int> ranks) const;

  // Another communicator over the same ranks, for a library that wants its own tag space.
  StatusOr<Group> Duplicate() const;

  bool empty() const { return comm_ == MPI_COMM_NULL; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // World rank of each member, indexed by group rank.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  MPI_Comm comm() const { return comm_; }

 private:
  // Takes ownership of `comm` and fills rank, size and world ranks.
  static StatusOr<Group> Adopt(MPI_Comm comm);
  void Free();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1;
  int size_ = 0;
  std::vector<int> world_ranks_;
};

}  // namespace autopar::device
