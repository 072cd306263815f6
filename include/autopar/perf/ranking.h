// Ranking a whole search space by the analytic model: the engine of `autopar-tune plan`.
#pragma once

#include <cstdint>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/space/space.h"

namespace autopar {

struct RankedConfig {
  ParallelConfig config;
  Estimate estimate;
};

struct Ranking {
  int64_t candidates = 0;        // configurations that satisfy the constraints
  int64_t feasible = 0;          // of those, the ones predicted to fit in memory
  double min_memory_gib = 0;     // the smallest predicted peak, to explain an empty answer
  std::vector<RankedConfig> top; // the `k` fastest feasible ones, fastest first
  int64_t faster_than_reference = 0;  // feasible ones predicted faster than `reference_s`
};

// Streams every configuration of `space` through memory then time, keeping the k fastest that
// fit, and counting those faster than `reference_s` (a configuration of the user's, to say where
// it ranks). Ties are broken by the enumeration order, so the result is deterministic.
Ranking RankSpace(const SearchSpace& space, const CostModel& model, int64_t k,
                  double reference_s = 0);

}  // namespace autopar
