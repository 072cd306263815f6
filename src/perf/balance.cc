// The stage balancer of docs/models.md §4.6: Megatron's uneven split (pp_first, pp_last, the
// other stages even, or with virtual stages the embedding and the loss counted in the split) and
// block-recompute depth chosen by branch and bound over every choice Megatron-LM can express, so
// the result is the exact optimum of the model, not a heuristic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/units.h"
#include "stages.h"

namespace autopar {
namespace {

// Calls fn(first, last) once for every split of `layers` over c.pp stages and c.vpp chunks that
// Megatron-core accepts, in canonical form; `skip(first, middle, last)` may rule out a split (or,
// with first = 0 and last = 0, a whole middle-stage size) before it is evaluated. A split's
// stages hold first, middle (pp − 2 of them) and last layers.
template <class Skip, class Fn>
void ForEachSplit(const ParallelConfig& c, int64_t layers, Skip&& skip, Fn&& fn) {
  const int64_t v = c.vpp;
  if (c.pp == 1) {
    fn(0, 0);
    return;
  }
  if (c.pp == 2) {
    for (int64_t first = v; first <= layers - v; first += v) {
      const int64_t last = layers - first;
      if (skip(first, int64_t{0}, last)) continue;
      fn(first == last ? 0 : first, 0);
    }
    return;
  }
  for (int64_t middle = v; (c.pp - 2) * middle <= layers - 2 * v; middle += v) {
    if (skip(int64_t{0}, middle, int64_t{0})) continue;
    const int64_t ends = layers - (c.pp - 2) * middle;
    for (int64_t first = v; first <= ends - v; first += v) {
      const int64_t last = ends - first;
      if (skip(first, middle, last)) continue;
      fn(first == middle ? 0 : first, last == middle ? 0 : last);
    }
  }
}

// The valid split whose largest stage is smallest (the even one where pp·vpp divides the
// layers); false when there is none.
bool MostEvenSplit(ParallelConfig& c, int64_t layers) {
  int64_t fewest = std::numeric_limits<int64_t>::max();
  ParallelConfig best = c;
  auto never = [](int64_t, int64_t, int64_t) { return false; };
  ForEachSplit(c, layers, never, [&](int64_t first, int64_t last) {
    ParallelConfig trial = c;
    trial.pp_first = static_cast<int32_t>(first);
    trial.pp_last = static_cast<int32_t>(last);
    int64_t largest = 0;
    for (int64_t stage = 0; stage < c.pp; ++stage) {
      largest = std::max(largest, StageLayers(trial, layers, stage));
    }
    if (largest < fewest) {
      fewest = largest;
      best = trial;
    }
  });
  if (fewest == std::numeric_limits<int64_t>::max()) return false;
  c = CanonicalStages(best, layers);
  return true;
}

// A forward and backward of the cheapest kind of layer the model has (dense or MoE, windowed
// or not).
double CheapestLayerTime(const ModelSpec& m, const StageTimeParts& parts) {
  double least = parts.dense.forward() + parts.dense.backward();
  if (m.is_moe()) least = std::min(least, parts.moe.forward() + parts.moe.backward());
  if (m.window_size > 0) {
    least = std::min(least, parts.dense_windowed.forward() + parts.dense_windowed.backward());
    if (m.is_moe()) {
      least = std::min(least, parts.moe_windowed.forward() + parts.moe_windowed.backward());
    }
  }
  return least;
}

// A chosen recompute depth no chunk reaches recomputes every layer: Megatron's and the space's 0.
void EveryLayerAsZero(ParallelConfig& c, int64_t layers) {
  int64_t deepest_chunk = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    deepest_chunk = std::max(deepest_chunk, StageLayers(c, layers, stage) / c.vpp);
  }
  if (c.recompute_layers >= deepest_chunk) c.recompute_layers = 0;
}

}  // namespace

bool CostModel::BalanceStages(ParallelConfig& c, bool choose_recompute_layers) const {
  const int64_t layers = model_.num_layers;
  // pp_first/pp_last splits need vpp to divide the layers; the counted ones (vpp > 1) need
  // pp·vpp to divide the layers and the embedding and/or the loss.
  const bool first_last = int64_t{c.pp} * c.vpp <= layers && layers % c.vpp == 0;
  const std::vector<ParallelConfig> counted = CountedSplits(c, layers);
  if (!first_last && counted.empty()) return false;
  c.split_embedding = c.split_loss = false;
  const StageTimeParts parts = TimeParts(c);
  const LayerBytes bytes = LayerBytesOf(c);  // the same for every split and depth
  const double cap = cluster_.gpu.memory_gib * kGiB;

  // Recompute depths from the least recompute to the most (0 = every layer): time grows and
  // memory shrinks along them, so a split's best depth is the first that fits.
  std::vector<int32_t> depths = {c.recompute_layers};
  if (choose_recompute_layers && c.recompute == Recompute::kFull) {
    depths.clear();
    const int64_t chunk = (layers + (counted.empty() ? 0 : 2)) / c.pp / c.vpp;
    for (int32_t d = 1; d < chunk + 1; ++d) depths.push_back(d);
    depths.push_back(0);
  }

  // The slowest stage's time and the peak memory of `trial`.
  struct Outcome {
    double slowest = 0, peak = 0;
  };
  auto evaluate = [&](const ParallelConfig& trial) {
    Outcome out;
    int64_t before = 0;
    for (int64_t stage = 0; stage < trial.pp; ++stage) {
      const StageLayout layout = LayoutOf(model_, trial, stage, before);
      before += layout.per_chunk;
      const LayerCost cost = StageTime(parts, trial, layout, stage);
      out.slowest = std::max(out.slowest, cost.forward() + cost.backward());
      out.peak = std::max(out.peak, StageMemory(trial, bytes, layout, stage).total());
    }
    return out;
  };

  // Lower bounds for pruning: a layer takes at least the cheapest kind's time; the last stage
  // adds its logits and loss.
  const double layer_min = CheapestLayerTime(model_, parts);
  const double last_min = parts.last_extra.forward() + parts.last_extra.backward();

  // Where even the first or the last stage cannot fit with the fewest layers Megatron allows
  // and everything recomputed, no split fits: keep the most even one, no search.
  if (c.pp > 1 && first_last) {
    ParallelConfig thin = c;
    thin.recompute_layers = depths.back();
    if (ThinEndStageOverflows(thin, cap)) return MostEvenSplit(c, layers);
  }

  double best_time = std::numeric_limits<double>::infinity();
  double least_peak = std::numeric_limits<double>::infinity(), best_peak = least_peak;
  ParallelConfig best = c, least = c;
  bool found = false, fits = false;
  auto skip = [&](int64_t first, int64_t middle, int64_t last) {
    if (!fits) return false;  // until a split fits, every split may be the least bad
    return middle * layer_min >= best_time || first * layer_min >= best_time ||
           last * layer_min + last_min >= best_time;
  };
  // Each depth of a split, the least recompute first, until one fits.
  auto consider = [&](ParallelConfig trial) {
    for (int32_t depth : depths) {
      trial.recompute_layers = depth;
      const Outcome o = evaluate(trial);
      found = true;
      if (o.peak <= cap) {
        // Ties (equal stages) go to the split with the lower peak memory.
        if (!fits || o.slowest < best_time || (o.slowest == best_time && o.peak < best_peak)) {
          best_time = o.slowest;
          best_peak = o.peak;
          best = trial;
        }
        fits = true;
        return;
      }
      if (!fits && o.peak < least_peak) {
        least_peak = o.peak;
        least = trial;
      }
    }
  };
  if (first_last) {
    ForEachSplit(c, layers, skip, [&](int64_t first, int64_t last) {
      ParallelConfig trial = c;
      trial.pp_first = static_cast<int32_t>(first);
      trial.pp_last = static_cast<int32_t>(last);
      consider(trial);
    });
  }
  for (const ParallelConfig& trial : counted) consider(trial);
  if (!found) return false;
  c = CanonicalStages(fits ? best : least, layers);
  if (choose_recompute_layers) EveryLayerAsZero(c, layers);
  return true;
}

bool CostModel::ThinEndStageOverflows(ParallelConfig c, double cap_bytes) const {
  // The first stage with vpp layers (the rest of the split as Megatron allows it), then the last.
  const int64_t layers = model_.num_layers, v = c.vpp;
  c.pp_first = static_cast<int32_t>(v);
  c.pp_last = static_cast<int32_t>(layers - v * (c.pp - 1));
  const LayerBytes bytes = LayerBytesOf(c);
  if (StageMemory(c, bytes, LayoutOf(model_, c, 0, 0), 0).total() > cap_bytes) return true;
  c.pp_first = static_cast<int32_t>(layers - v * (c.pp - 1));
  c.pp_last = static_cast<int32_t>(v);
  const int64_t before = (layers - v) / v;  // the earlier stages' layers per chunk
  return StageMemory(c, bytes, LayoutOf(model_, c, c.pp - 1, before), c.pp - 1).total() > cap_bytes;
}

}  // namespace autopar
