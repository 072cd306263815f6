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

}  // namespace autopar::trial
