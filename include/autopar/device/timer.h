// Wall-clock timing of device work.
//
// Callers bracket a region with Device::Synchronize() so the host clock measures finished work, the
// way Megatron's timers do; on the CPU device Synchronize is a no-op because ops are synchronous.
#pragma once

#include <chrono>

namespace autopar::device {

class WallTimer {
 public:
  WallTimer() : start_(Clock::now()) {}
  void Start() { start_ = Clock::now(); }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

}  // namespace autopar::device
