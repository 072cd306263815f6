// Carves consecutive views out of one allocation: first without a buffer, to measure what a set
// of views needs, then over the buffer allocated for it, with the same sequence of Take calls.
#pragma once

#include <cstdint>

#include "autopar/device/tensor.h"

namespace autopar::trial {

class Carver {
 public:
  Carver() = default;  // measures only
  explicit Carver(device::Tensor base) : base_(base), measure_(false) {}
  device::Tensor Take(int64_t numel) {
    const device::Tensor t = measure_ ? device::Tensor{} : base_.Slice(used_, numel);
    used_ += numel;
    return t;
  }
  int64_t used() const { return used_; }

 private:
  device::Tensor base_;
  bool measure_ = true;
  int64_t used_ = 0;
};

}  // namespace autopar::trial
