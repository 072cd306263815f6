#include "autopar/perf/ranking.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "autopar/spec/units.h"

namespace autopar {

Ranking RankSpace(const SearchSpace& space, const CostModel& model, int64_t k, double reference_s) {
  Ranking r;
  r.min_memory_gib = std::numeric_limits<double>::infinity();
  const double budget_gib = space.cluster().gpu.memory_gib;

  // Max-heap on (step time, enumeration index): the root is the worst of the kept k.
  struct Entry {
    double step_time_s;
    int64_t index;
    ParallelConfig config;
    bool operator<(const Entry& o) const {
      return step_time_s != o.step_time_s ? step_time_s < o.step_time_s : index < o.index;
    }
  };
  std::priority_queue<Entry> heap;
  space.ForEach([&](const ParallelConfig& c) {
    const int64_t index = r.candidates++;
    // Memory is cheaper than time and prunes most of a large space.
    const double memory_gib = model.Memory(c).total() / kGiB;
    r.min_memory_gib = std::min(r.min_memory_gib, memory_gib);
    if (memory_gib > budget_gib) return;
    ++r.feasible;
    if (k <= 0 && reference_s <= 0) return;
    const double t = model.Time(c).step_time_s;
    if (t < reference_s) ++r.faster_than_reference;
    if (k <= 0) return;
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push({t, index, c});
    } else if (Entry{t, index, c} < heap.top()) {
      heap.pop();
      heap.push({t, index, c});
    }
  });
  while (!heap.empty()) {
    r.top.push_back({heap.top().config, model.Evaluate(heap.top().config)});
    heap.pop();
  }
  std::reverse(r.top.begin(), r.top.end());
  return r;
}

}  // namespace autopar
