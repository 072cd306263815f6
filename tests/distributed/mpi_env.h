// Shared state of the distributed test binary: the world group and a CPU platform, built once in
// main() after MPI_Init and destroyed before MPI_Finalize.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "autopar/device/group.h"
#include "autopar/device/platform.h"
#include "kernels/init.h"

namespace autopar::device::testing {

Group& World();
Platform& TestPlatform();
// The CPU platform options of the run: `--p2p-semantics nccl` on the test binary's command line
// runs the whole suite under the NCCL-semantics emulation (see device::P2PSemantics).
CpuPlatformOptions TestPlatformOptions();

// Test data as a pure function of (seed, index, rank): multiples of 1/8 in [-8, 8), so sums over a
// few ranks are exact in fp32 whatever order the transport reduces in.
inline float Value(std::uint64_t seed, std::int64_t index, int rank) {
  const float u = kernels::ref::HashUniform(
      seed, static_cast<std::uint64_t>(rank) * 1000003u + static_cast<std::uint64_t>(index));
  return std::floor(u * 64.0f) / 8.0f;
}

// Rank `rank`'s n values of a test's data: any rank can compute any other's.
inline std::vector<float> Data(std::uint64_t seed, std::int64_t n, int rank) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = Value(seed, i, rank);
  return v;
}

}  // namespace autopar::device::testing
