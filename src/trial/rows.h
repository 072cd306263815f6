// Row gathers: the data movement of the Ulysses all-to-alls and of MoE dispatch and combine,
// built from the Device interface's vocabulary-parallel embedding lookup (a row gather whose
// out-of-range ids give zero rows), so every device runs them with the ops it already has.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "autopar/device/device.h"

namespace autopar::trial {

// out[i] = row ids[i] of `table` viewed as rows of `width` elements; an id past the last row
// gives a zero row. ids is i32 on the device; out holds ids.numel rows.
inline device::Status PickRows(device::Device& device, device::Tensor table, int64_t width,
                               device::Tensor ids, device::Tensor out) {
  if (ids.numel == 0) return device::OkStatus();
  const device::EmbeddingDesc d{ids.numel, width, table.numel / width, 0};
  return device.EmbeddingForward(d, table, ids, out);
}

// Host-built index lists, uploaded into one i32 device buffer.
class IdLists {
 public:
  // Reserves a list; its view is valid after Upload.
  size_t Add(std::vector<int32_t> ids) {
    lists_.push_back(std::move(ids));
    return lists_.size() - 1;
  }
  device::Status Upload(device::Device& device) {
    int64_t total = 0;
    for (const auto& l : lists_) total += static_cast<int64_t>(l.size());
    std::vector<int32_t> flat;
    flat.reserve(static_cast<size_t>(total));
    for (const auto& l : lists_) flat.insert(flat.end(), l.begin(), l.end());
    AUTOPAR_ASSIGN_OR_RETURN(buffer_,
                             device.Allocate(std::max<int64_t>(total, 1), device::DType::kI32));
    views_.clear();
    int64_t offset = 0;
    for (const auto& l : lists_) {
      views_.push_back(buffer_.tensor().Slice(offset, static_cast<int64_t>(l.size())));
      offset += static_cast<int64_t>(l.size());
    }
    if (total == 0) return device::OkStatus();
    return device.Upload(buffer_.tensor().Slice(0, total), flat);
  }
  device::Tensor operator[](size_t i) const { return views_[i]; }
  size_t size() const { return lists_.size(); }

 private:
  std::vector<std::vector<int32_t>> lists_;
  std::vector<device::Tensor> views_;
  device::Buffer buffer_;
};

// Sums of groups of a table's rows, out[i] = Σ_{r ∈ groups[i]} table[r] (a zero row for an empty
// group), with no padding: the groups are ordered longest first, so the j-th members of every
// group that has one form a prefix of that order, gathered and added in one call each; a last
// gather puts the sums in group order. (MoE flex dispatch: each rank's gate-weighted expert
// outputs of one token, and each token's rows from the ranks that hold its experts.)
class RowSum {
 public:
  RowSum() = default;
  // Plans the sum of `groups` (row ids of the table), its index lists added to `ids`.
  RowSum(const std::vector<std::vector<int32_t>>& groups, IdLists& ids) {
    const int32_t n = static_cast<int32_t>(groups.size());
    std::vector<int32_t> order(groups.size());
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return groups[x].size() > groups[y].size(); });
    std::vector<int32_t> unsort(groups.size(), n);  // empty groups: the zero row past the end
    for (int32_t pos = 0; pos < n; ++pos) {
      if (!groups[order[pos]].empty()) unsort[order[pos]] = pos;
    }
    const size_t longest = groups.empty() ? 0 : groups[order[0]].size();
    for (size_t j = 0; j < longest; ++j) {
      std::vector<int32_t> members;
      for (int32_t pos = 0; pos < n && groups[order[pos]].size() > j; ++pos) {
        members.push_back(groups[order[pos]][j]);
      }
      members_.push_back(ids.Add(std::move(members)));
    }
    unsort_ = ids.Add(std::move(unsort));
    groups_ = n;
  }
  int64_t groups() const { return groups_; }

  // out [groups, width] = the sums of `table`'s rows; `sorted` and `scratch` hold groups rows
  // each, and none of the three may overlap. `ids` uploaded.
  device::Status Apply(device::Device& device, const IdLists& ids, device::Tensor table,
                       int64_t width, device::Tensor sorted, device::Tensor scratch,
                       device::Tensor out) const {
    if (groups_ == 0) return device::OkStatus();
    if (members_.empty()) return device.Fill(out.Slice(0, groups_ * width), 0.0f);
    AUTOPAR_RETURN_IF_ERROR(PickRows(device, table, width, ids[members_[0]], sorted));
    for (size_t j = 1; j < members_.size(); ++j) {
      const int64_t rows = ids[members_[j]].numel;
      AUTOPAR_RETURN_IF_ERROR(PickRows(device, table, width, ids[members_[j]], scratch));
      AUTOPAR_RETURN_IF_ERROR(device.Add(sorted.Slice(0, rows * width),
                                         scratch.Slice(0, rows * width),
                                         sorted.Slice(0, rows * width)));
    }
    const int64_t filled = ids[members_[0]].numel;
    return PickRows(device, sorted.Slice(0, filled * width), width, ids[unsort_], out);
  }

 private:
  std::vector<size_t> members_;  // per j, the j-th member of each group that has one
  size_t unsort_ = 0;            // group → its place in the order (past the end: empty)
  int64_t groups_ = 0;
};

}  // namespace autopar::trial
