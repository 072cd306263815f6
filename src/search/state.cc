#include "autopar/search/state.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>

namespace autopar::search {
namespace {

constexpr const char* kOutcomeNames[] = {"ok",           "oom",       "timeout",     "comm_error",
                                         "device_error", "nonfinite", "worker_lost", "invalid"};

// Layers per stage that keep only their input under full recompute (0 means every layer).
int64_t RecomputedLayers(const ParallelConfig& c) {
  return c.recompute_layers == 0 ? INT64_MAX : c.recompute_layers;
}

// Whether recompute setting `a` stores at least the activations `b` stores, everything else
// equal: none ≥ selective ≥ full over every layer, and full over fewer layers ≥ full over more.
// Selective against partial full recompute depends on the layer shapes: not comparable.
bool RecomputeKeepsAtLeast(const ParallelConfig& a, const ParallelConfig& b) {
  switch (a.recompute) {
    case Recompute::kNone:
      return true;
    case Recompute::kSelective:
      return b.recompute == Recompute::kSelective ||
             (b.recompute == Recompute::kFull && b.recompute_layers == 0);
    case Recompute::kFull:
      return b.recompute == Recompute::kFull && RecomputedLayers(a) <= RecomputedLayers(b);
  }
  return false;
}

}  // namespace

const char* ToString(Outcome o) { return kOutcomeNames[static_cast<int>(o)]; }

std::optional<Outcome> ParseOutcome(const std::string& text) {
  for (int i = 0; i < static_cast<int>(std::size(kOutcomeNames)); ++i) {
    if (text == kOutcomeNames[i]) return static_cast<Outcome>(i);
  }
  return std::nullopt;
}

SearchSettings SearchSettings::Default(const CandidateSet& candidates) {
  SearchSettings s;
  s.time_prior = TimePrior::Default(candidates.median_nominal_time_s());
  // The unknown runtime overhead is a few percent of the device, not a fixed 2 GiB: a 4 GiB
  // CPU-backend budget would otherwise look too uncertain to ever fit.
  s.memory_prior.offset_sd_gib =
      std::min(s.memory_prior.offset_sd_gib, 0.025 * candidates.capacity_gib());
  return s;
}

bool NeedsAtLeastAsMuchMemory(const ParallelConfig& a, const ParallelConfig& b) {
  // The layout decides how weights and activations are split: only compare within one layout.
  if (a.tp != b.tp || a.pp != b.pp || a.dp != b.dp || a.cp != b.cp || a.up != b.up ||
      a.ep != b.ep || a.etp != b.etp || a.vpp != b.vpp) {
    return false;
  }
  if (a.mbs < b.mbs) return false;
  if (a.sp && !b.sp) return false;              // SP shards activations: on needs less
  if (a.dist_opt && !b.dist_opt) return false;  // so does the distributed optimizer's state
  return RecomputeKeepsAtLeast(a, b);
}

SearchState::SearchState(const CandidateSet& candidates, SearchSettings settings)
    : candidates_(candidates),
      settings_(std::move(settings)),
      time_(settings_.time_prior, candidates),
      memory_(settings_.memory_prior, candidates.num_levels(), candidates.varying_knobs()) {
  if (!(settings_.max_p_oom > 0 && settings_.max_p_oom < 1)) {
    throw std::invalid_argument("max_p_oom must be in (0, 1)");
  }
  if (settings_.max_failures < 1) throw std::invalid_argument("max_failures must be >= 1");
  const size_t n = static_cast<size_t>(candidates_.size());
  flags_.assign(n, 0);
  eligible_.assign(n, 0);
  failures_.assign(n, 0);
  measured_time_s_.assign(n, std::numeric_limits<double>::quiet_NaN());
  RefreshMemoryFit();
}

double SearchState::best_time_s() const {
  return best_ < 0 ? std::numeric_limits<double>::infinity() : measured_time_s_[best_];
}

MemoryRow SearchState::memory_row(int64_t i) const {
  return {candidates_.nominal_memory_gib(i), candidates_.levels_of(i), candidates_.varying_knobs()};
}

double SearchState::POom(int64_t i) const {
  return memory_.POom(memory_row(i), candidates_.capacity_gib());
}

void SearchState::RefreshEligible(int64_t i) {
  const bool now = flags_[i] == 0;
  if (now != (eligible_[i] != 0)) eligible_count_ += now ? 1 : -1;
  eligible_[i] = now ? 1 : 0;
}

void SearchState::RefreshMemoryFit() {
  const double q = memory_.FitQuantile(settings_.max_p_oom);
  const double capacity = candidates_.capacity_gib();
  for (int64_t i = 0; i < candidates_.size(); ++i) {
    // The headroom's sign decides alone when it agrees with the quantile's (always at
    // max_p_oom = 0.5, where q = 0): the predictive scale costs a triangular solve.
    const MemoryRow row = memory_row(i);
    const double headroom = memory_.Headroom(row, capacity);
    const bool fits = (q >= 0 && headroom <= 0)  ? false
                      : (q <= 0 && headroom > 0) ? true
                                                 : memory_.Margin(row, capacity) > q;
    flags_[i] = static_cast<uint8_t>(fits ? flags_[i] & ~kUnlikelyFit : flags_[i] | kUnlikelyFit);
    RefreshEligible(i);
  }
}

void SearchState::Observe(const Observation& o) {
  if (o.candidate < 0 || o.candidate >= candidates_.size()) {
    throw std::invalid_argument("observation of candidate " + std::to_string(o.candidate) +
                                " outside the candidate set of " +
                                std::to_string(candidates_.size()));
  }
  const int64_t i = o.candidate;
  const bool has_peak = !std::isnan(o.peak_memory_gib);
  if (has_peak && !(std::isfinite(o.peak_memory_gib) && o.peak_memory_gib > 0)) {
    throw std::invalid_argument("non-finite or non-positive peak memory " +
                                std::to_string(o.peak_memory_gib) + " for " +
                                ToSpec(candidates_.config(i)));
  }
  bool memory_changed = false;
  switch (o.outcome) {
    case Outcome::kOk:
      if (!(std::isfinite(o.step_time_s) && o.step_time_s > 0)) {
        throw std::invalid_argument("ok observation of " + ToSpec(candidates_.config(i)) +
                                    " with step time " + std::to_string(o.step_time_s) +
                                    " (report it as nonfinite)");
      }
      if (measured(i)) {
        throw std::invalid_argument(ToSpec(candidates_.config(i)) + " was already measured");
      }
      if (settings_.learn_time) {
        time_errors_.push_back(time_.Observe(candidates_, i, o.step_time_s));
      }
      flags_[i] |= kMeasured;
      measured_time_s_[i] = o.step_time_s;
      ++measured_count_;
      if (best_ < 0 || o.step_time_s < measured_time_s_[best_]) best_ = i;
      break;
    case Outcome::kOom:
      memory_changed = memory_.ObserveOom(memory_row(i), candidates_.capacity_gib());
      flags_[i] |= kRetired;
      for (int64_t j = 0; j < candidates_.size(); ++j) {
        if (j != i && NeedsAtLeastAsMuchMemory(candidates_.config(j), candidates_.config(i))) {
          flags_[j] |= kPruned;
          RefreshEligible(j);
        }
      }
      break;
    default:
      if (failures_[i] < 255) ++failures_[i];
      if (failures_[i] >= settings_.max_failures) flags_[i] |= kRetired;
      break;
  }
  // A peak is a measurement of the memory model whatever the time outcome (not for an OOM,
  // whose reported figure is what it tried to allocate, not what it held).
  if (has_peak && o.outcome != Outcome::kOom) {
    memory_.ObservePeak(memory_row(i), o.peak_memory_gib);
    memory_changed = true;
  }
  RefreshEligible(i);
  if (memory_changed) RefreshMemoryFit();
  history_.push_back(o);
}

uint64_t SearchState::Digest() const {
  Hasher h;
  time_.AddToDigest(&h);
  memory_.regression().AddToDigest(&h);
  h.Add(static_cast<uint64_t>(history_.size()));
  h.Add(static_cast<uint64_t>(eligible_count_));
  h.Add(static_cast<uint64_t>(best_));
  h.Add(reinterpret_cast<const char*>(flags_.data()), flags_.size());
  h.Add(reinterpret_cast<const char*>(failures_.data()), failures_.size());
  return h.value();
}

}  // namespace autopar::search
