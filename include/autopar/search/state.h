// SearchState: what the search knows after a sequence of trials: both posteriors, which
// candidates were measured, which failed, which can no longer be proposed (docs/search.md §7, issue
// "failures").
//
// Rules, applied by Observe():
//   ok          → the time posterior learns the step time, the memory posterior the peak.
//   oom         → the memory posterior learns a censored peak (see MemoryPosterior), the
//                 configuration is retired, and every candidate that needs at least as much
//                 memory by construction (same layout, micro-batch ≥, less recompute, SP and the
//                 distributed optimizer no more enabled) is pruned.
//   timeout, comm_error, device_error, nonfinite, worker_lost, invalid
//               → recorded; the configuration may be proposed again, but a configuration that
//                 failed `max_failures` (2) times never is.
// A candidate is eligible for a proposal when it is neither measured, retired nor pruned and its
// predicted P(OOM) is below `max_p_oom`.
//
// Observe() is the only mutator, so replaying the same observations gives the same state, bit for
// bit; Digest() summarises it for the journal's replay check.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autopar/search/candidates.h"
#include "autopar/search/posterior.h"

namespace autopar::search {

enum class Outcome : uint8_t {
  kOk,
  kOom,
  kTimeout,
  kCommError,
  kDeviceError,
  kNonfinite,
  kWorkerLost,
  kInvalid,
};
const char* ToString(Outcome o);  // ok, oom, timeout, comm_error, ...
std::optional<Outcome> ParseOutcome(const std::string& text);

struct Observation {
  int64_t candidate = -1;
  Outcome outcome = Outcome::kOk;
  double step_time_s = std::numeric_limits<double>::quiet_NaN();      // required for kOk
  double peak_memory_gib = std::numeric_limits<double>::quiet_NaN();  // used when > 0
};

struct SearchSettings {
  TimePrior time_prior;
  MemoryPrior memory_prior;
  // What the analytic peak already counts for memory besides tensors (the cost model's
  // runtime_overhead_gib); a probe's measured figure moves the prior's offset by the difference.
  double modelled_non_tensor_gib = 0;
  // Candidates at or above this predicted P(OOM) are never proposed. Below it, Thompson sampling
  // weighs the risk itself (it draws the memory model too); the baselines take them as they come.
  double max_p_oom = 0.9;
  int max_failures = 2;  // failures after which a configuration is never proposed again
  // Whether measured step times feed the time posterior (O(n²) per measurement). The baselines
  // that do not follow it (grid, random, analytic) turn it off: they record times all the same.
  bool learn_time = true;

  // Defaults for a candidate set: the time prior's θ₀ scale follows its median step time.
  static SearchSettings Default(const CandidateSet& candidates);
};

// True when configuration `a` needs at least as much memory as `b` by construction.
bool NeedsAtLeastAsMuchMemory(const ParallelConfig& a, const ParallelConfig& b);

class SearchState {
 public:
  SearchState(const CandidateSet& candidates, SearchSettings settings);

  // Throws std::invalid_argument on a candidate out of range, an ok observation whose step time
  // is not finite and positive, or a non-finite peak: the caller maps bad measurements to the
  // `nonfinite` outcome before they get here.
  void Observe(const Observation& o);

  const CandidateSet& candidates() const { return candidates_; }
  const SearchSettings& settings() const { return settings_; }
  const std::vector<Observation>& history() const { return history_; }
  int64_t trials() const { return static_cast<int64_t>(history_.size()); }

  bool eligible(int64_t i) const { return eligible_[i] != 0; }
  const std::vector<uint8_t>& eligible_mask() const { return eligible_; }
  int64_t eligible_count() const { return eligible_count_; }
  bool measured(int64_t i) const { return (flags_[i] & kMeasured) != 0; }
  bool retired(int64_t i) const { return (flags_[i] & kRetired) != 0; }
  bool pruned(int64_t i) const { return (flags_[i] & kPruned) != 0; }
  int failures(int64_t i) const { return failures_[i]; }
  double measured_time_s(int64_t i) const { return measured_time_s_[i]; }  // NaN if not measured
  int64_t measured_count() const { return measured_count_; }
  // The fastest measured candidate (-1 before the first ok trial) and its time (+inf).
  int64_t best() const { return best_; }
  double best_time_s() const;

  const TimePosterior& time() const { return time_; }
  const MemoryPosterior& memory() const { return memory_; }
  MemoryRow memory_row(int64_t i) const;
  double POom(int64_t i) const;
  // Per ok trial, in order: the standardised error of its step time under the predictive before
  // it was learnt (TimePosterior::Observe).
  const std::vector<double>& time_errors() const { return time_errors_; }

  uint64_t Digest() const;

 private:
  enum Flag : uint8_t { kMeasured = 1, kRetired = 2, kPruned = 4, kUnlikelyFit = 8 };
  void RefreshMemoryFit();
  void RefreshEligible(int64_t i);

  const CandidateSet& candidates_;
  SearchSettings settings_;
  TimePosterior time_;
  MemoryPosterior memory_;
  std::vector<uint8_t> flags_, eligible_, failures_;
  std::vector<double> measured_time_s_;
  std::vector<double> time_errors_;
  std::vector<Observation> history_;
  int64_t eligible_count_ = 0;
  int64_t measured_count_ = 0;
  int64_t best_ = -1;
};

}  // namespace autopar::search
