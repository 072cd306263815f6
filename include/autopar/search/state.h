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
// Measurements are noisy (a shared cluster, a clock that moves between runs), so a measured
// configuration may be measured again, up to `max_measurements` times (docs/search.md §7a):
//   - its measured time is the mean of its measurements;
//   - the relative measurement noise σ_m is learnt from the repeats alone (pooled within-
//     configuration variance of log times, with an inverse-gamma prior of `noise_prior_sd`
//     and strength `noise_prior_dof`);
//   - what the study believes of a measured configuration, Estimated(i), combines its measured
//     mean (variance σ_m²/k) with the posterior's prediction of its time (the model's variance
//     plus the part of the residual variance that σ_m does not explain: a deviation of that
//     configuration, not noise): precision weighting, as for two normal estimates of one value;
//   - the recommendation best() is the lowest estimate among the contenders: the measured
//     configurations whose mean is within ε + 4σ_m of the lowest mean (the others cannot win).
// Where repeats show no noise, σ_m falls, an estimate is its measured mean, and the best is the
// fastest measured configuration, as before; where they show 5% noise, one lucky measurement
// no longer decides the recommendation.
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

// The default ceiling on a proposal's predicted P(OOM), `--max-p-oom` (docs/search.md §4).
inline constexpr double kDefaultMaxPOom = 0.99;

struct SearchSettings {
  TimePrior time_prior;
  MemoryPrior memory_prior;
  // What the analytic peak already counts for memory besides tensors (the cost model's
  // runtime_overhead_gib); a probe's measured figure moves the prior's offset by the difference.
  double modelled_non_tensor_gib = 0;
  // Candidates at or above this predicted P(OOM) are never proposed. Below it, Thompson sampling
  // weighs the risk itself (it draws the memory model too); the baselines take them as they come.
  double max_p_oom = kDefaultMaxPOom;
  int max_failures = 2;  // failures after which a configuration is never proposed again
  // Whether measured step times feed the time posterior (O(n²) per measurement). The baselines
  // that do not follow it (grid, random, analytic) turn it off: they record times all the same.
  bool learn_time = true;
  // Repeated measurements: at most this many of one configuration, and the prior of the
  // relative measurement noise (a sd and its strength in pseudo-degrees of freedom). 24: at
  // 4-5% noise the mean of 8 has a sd of 1.5-1.8%, and the lowest of a dozen such contenders'
  // means sits 2-3% below its own truth (docs/search.md §7a); 24 brings the sd under 1%.
  // Where the repeats agree (resolution below), the cap is never reached.
  int max_measurements = 24;
  // The repeats that tell the noise: Thompson measures the recommendation again once it has
  // stayed the recommendation over confirm_after·(r + 1) newly measured configurations, while
  // fewer than `confirm_repeats` repeats have been made (r): where the search is settling, not
  // while it is still finding better ones. The stop rule's model rules wait for them. Two,
  // because one repeat of a 4%-noisy measurement agrees to 0.5% one time in ten and would make
  // the study trust single measurements; two, one time in seventy.
  int64_t confirm_after = 5;
  int64_t confirm_repeats = 2;
  double noise_prior_sd = 0.005;
  double noise_prior_dof = 1;
  // The relative margin beyond the best mean within which a measured configuration stays a
  // contender for the recommendation (plus 4 σ_m).
  double contender_margin = 0.02;
  // The relative sd of a measured mean below which it is known well enough (worth_repeating).
  double resolution = 0.005;
  // Check trials (docs/search.md §8): every `check_every`-th trial from trial `check_from` on
  // (0: none), Thompson proposes from a draw spread `check_temper` times wider about the
  // posterior mean, its hypothesis (scales of the discrepancy) picked uniformly where
  // `check_any_hypothesis`; the errors of what they measure calibrate the stop rule.
  double check_temper = 3;
  int64_t check_every = 3;
  int64_t check_from = 5;
  bool check_any_hypothesis = true;
  // While the last `check_agree_window` check errors (at least two) lie within the posterior's
  // intervals (their mean square at most 1), the next check comes `check_every_agreeing` trials
  // after the last one instead of `check_every` (0: always check_every).
  int64_t check_every_agreeing = 6;
  int64_t check_agree_window = 5;
  // A trial that is not a check nor a repeat measures the candidate of largest expected
  // improvement on the recommendation, E[max(τ − t, 0)]·P(fit), among a shortlist: the
  // `improvement_shortlist` eligible candidates of lowest posterior mean and the trial's own
  // Thompson pick (docs/search.md §6). A shortlist of 0 leaves every trial to Thompson's pick.
  int64_t improvement_shortlist = 64;
  // Of the shortlist, only those at most this likely to run out of memory compete, and the draw's
  // own pick (which took its risk in proportion to it).
  double improvement_max_p_oom = 0.5;
  // Top-two Thompson sampling (Russo 2016) on repeats: where a trial's draw picks a measured
  // contender, with probability 1 − top_two_beta the trial measures instead the challenger, the
  // pick of a fresh draw that differs from it (up to `top_two_redraws` draws; none found: the
  // repeat). A contender that stays the likeliest fastest is then measured about half the time,
  // not on every trial, and the rest goes to what could still beat it (docs/search.md §7a).
  // 1 turns it off.
  double top_two_beta = 0.5;
  int64_t top_two_redraws = 4;

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
  int measurements(int64_t i) const { return measurements_[i]; }
  // Measured and not yet measured max_measurements times (nor retired).
  bool repeatable(int64_t i) const;
  // Repeatable, some repeat has shown the noise, and the configuration's measured mean is still
  // noisier than `resolution` (σ_m/√k): another measurement would tell something. Where the
  // noise is small, one measurement is enough.
  bool worth_repeating(int64_t i) const;
  int64_t repeats() const { return repeats_; }  // ok measurements of a measured configuration
  bool retired(int64_t i) const { return (flags_[i] & kRetired) != 0; }
  bool pruned(int64_t i) const { return (flags_[i] & kPruned) != 0; }
  int failures(int64_t i) const { return failures_[i]; }
  // The mean of its measurements (NaN if not measured).
  double measured_time_s(int64_t i) const { return measured_time_s_[i]; }
  int64_t measured_count() const { return measured_count_; }
  // σ_m: the relative noise of one measurement.
  double measurement_noise_sd() const;
  // What the study believes a measured configuration's step time is (seconds): a normal with
  // this mean and sd (see above).
  struct Estimate {
    double mean_s, sd_s;
  };
  Estimate Estimated(int64_t i) const;
  // The measured configurations that can still be the best (see above), recommendation first.
  const std::vector<int64_t>& contenders() const { return contenders_; }
  // The recommendation (-1 before the first ok trial) and its estimated time (+inf).
  int64_t best() const { return best_; }
  // Configurations measured since the recommendation last changed.
  int64_t best_unchanged_for() const { return measured_count_ - best_since_; }
  double best_time_s() const;

  const TimePosterior& time() const { return time_; }
  const MemoryPosterior& memory() const { return memory_; }
  MemoryRow memory_row(int64_t i) const;
  double POom(int64_t i) const;
  // Per ok trial, in order: the standardised error of its step time under the predictive before
  // it was learnt (TimePosterior::Observe).
  const std::vector<double>& time_errors() const { return time_errors_; }
  // Whether trial `trial` is a check trial (SearchSettings::check_every): a past one as it was,
  // the next ones at the gap the checks so far ask for. And the standardised errors of the check
  // trials that measured a configuration the first time.
  bool IsCheckTrial(int64_t trial) const;
  // Whether the last check errors lie within the posterior's intervals (check_every_agreeing).
  bool ChecksAgree() const;
  const std::vector<double>& check_errors() const { return check_errors_; }

  uint64_t Digest() const;

 private:
  enum Flag : uint8_t { kMeasured = 1, kRetired = 2, kPruned = 4, kUnlikelyFit = 8 };
  void RefreshMemoryFit();
  void RefreshEligible(int64_t i);
  void RefreshBest();
  int64_t CheckGap() const;  // trials from one check to the next (check_every[_agreeing])

  const CandidateSet& candidates_;
  SearchSettings settings_;
  TimePosterior time_;
  MemoryPosterior memory_;
  std::vector<uint8_t> flags_, eligible_, failures_;
  std::vector<double> measured_time_s_;
  std::vector<uint8_t> measurements_;
  std::vector<double> log_sum_;  // Σ log y of each configuration
  double noise_ss_ = 0;          // pooled within-configuration Σ (log y − mean)²
  int64_t repeats_ = 0;
  std::vector<int64_t> contenders_;
  std::vector<double> time_errors_, check_errors_;
  std::vector<int64_t> past_checks_;  // the check trials so far, in order
  int64_t next_check_ = -1;           // the next check trial (-1: none)
  std::vector<Observation> history_;
  int64_t eligible_count_ = 0;
  int64_t measured_count_ = 0;
  int64_t best_ = -1;
  int64_t best_since_ = 0;  // measured_count_ when best_ last changed
};

}  // namespace autopar::search
