// Communicators cached by the world ranks they span, so a later trial that forms the same group
// reuses the communicator instead of building a new one (NCCL set-up costs tens of milliseconds to
// seconds per group, more than a short trial step).
//
// The key is the group's world ranks in group-rank order (Group::world_ranks()): two groups over
// the same ranks ordered differently assign different ranks and are different communicators.
// Pure and header-only, so the host tests check the keying without a GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace autopar::device {

template <typename Comm>
class MemberSetCache {
 public:
  using Key = std::vector<int>;

  // The communicator over exactly `members` (same ranks, same order), or nullptr.
  std::shared_ptr<Comm> Find(std::span<const int> members) const {
    const auto it = comms_.find(Key(members.begin(), members.end()));
    return it == comms_.end() ? nullptr : it->second;
  }
  // Replaces whatever was cached for `members`.
  void Insert(std::span<const int> members, std::shared_ptr<Comm> comm) {
    comms_[Key(members.begin(), members.end())] = std::move(comm);
  }
  // True when `pred` holds for some cached communicator.
  template <typename Pred>
  bool Any(Pred&& pred) const {
    return std::any_of(comms_.begin(), comms_.end(),
                       [&](const auto& entry) { return pred(*entry.second); });
  }
  // Calls `fn(comm)` on every cached communicator in key order (the same on every rank).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& entry : comms_) fn(*entry.second);
  }
  // Drops every entry in key order, the same order on every rank (destroying an NCCL
  // communicator may synchronize with its peers).
  void Clear() {
    while (!comms_.empty()) comms_.erase(comms_.begin());
  }
  // Drops, in key order, every entry whose members are not one of `keep`. Every member of a kept
  // group keeps it too when `keep` is each rank's own groups of one configuration, since a group
  // is one of the groups of each of its members: the caches of a group's members stay alike.
  void RetainOnly(std::span<const Key> keep) {
    for (auto it = comms_.begin(); it != comms_.end();) {
      it = std::find(keep.begin(), keep.end(), it->first) == keep.end() ? comms_.erase(it)
                                                                        : std::next(it);
    }
  }
  std::size_t size() const { return comms_.size(); }

 private:
  std::map<Key, std::shared_ptr<Comm>> comms_;
};

// The color of a group in a split of the world (ncclCommSplit, MPI_Comm_split): its lowest world
// rank. Every member computes the same value, and disjoint groups get different ones. -1 for an
// empty list.
inline int SplitColor(std::span<const int> members) {
  if (members.empty()) return -1;
  return *std::min_element(members.begin(), members.end());
}

}  // namespace autopar::device
