// Stop rules of the online search (docs/search.md §8), checked before every proposal.
//
//   exhausted   no candidate is eligible any more;
//   max_trials  --max-trials trials have finished;
//   budget      the study's tuning wall time reached --budget (8 h by default);
//   converged   no other configuration is faster than the recommendation, with probability at
//               least `converged_fraction` (99%) over `draws` (200) posterior draws;
//   no_likely_improvement
//               the probability that some other configuration beats the recommendation by more
//               than ε (2%) is below δ (0.2%);
//   noise_limited
//               neither holds, but one of them would without the contenders that, like the
//               recommendation, are not worth measuring again (SearchState::worth_repeating:
//               measured max_measurements times, or known to `resolution`): what is left in
//               doubt is within the measurement noise, and more trials cannot settle it.
// The last three follow the posterior and apply only to a searcher that does (Thompson), once
// `min_measured` configurations have been measured.
//
// The recommendation is the lowest estimate (SearchState::Estimated), itself uncertain under
// noise: each draw takes a value of it as its threshold, and the other contenders count with
// their estimates. The probabilities are over the posterior predictive, not the posterior mean:
// a configuration's step time is y_i = t_i(θ) + ŷ_i·σ'·ε_i, the model plus the per-configuration
// deviation the data show, the measurement noise taken out of σ (a configuration predicted 1%
// slower than the best still beats it with a real probability). For each draw (θ_j, σ_j) the
// probability that no eligible configuration beats a threshold τ is Π_i Φ((t_i(θ_j) − τ)/(ŷ_i
// σ'_j)), in closed form; the rules average it over the draws (a Monte Carlo estimate over θ,
// exact over the noise). The draws come from Rng(seed, trial, kStopCheck), so the decision
// replays exactly.
//
// None fires while the posterior is being surprised: each of the last `recent` (3) measured
// step times must have fallen within `recent_bound` (2) standard deviations of the predictive it
// had before it was learnt (SearchState::time_errors). A cluster that differs from the model in a
// way the posterior has not yet taken in shows up there first, while the draws still look sure.
//
// Nor do they trust the posterior's spread more than its checks do. The errors of the
// configurations Thompson proposes say little about the ones it never proposes: a posterior that
// has the cluster wrong where it has not measured (a pair of knob values 25% faster than any
// measured cell suggests) predicts its own picks well and stops, confident, on the wrong
// configuration. So every third trial is a check trial (SearchSettings::check_every; every sixth
// while the checks agree with the posterior, check_every_agreeing) proposed
// from a draw three times wider, and its standardised error tells how far the posterior's
// intervals hold away from its own picks. The model rules wait for `min_checks` (2) of them, and
// their draws are spread about their regression's mean by the calibration scale
// c = max(1, √((ν + Σ e²)/(ν + n))) of the last `calibration_window` (5) check errors e, with ν
// (2) pseudo-errors of 1: a posterior whose checks fall outside its intervals claims less.
//
// The first two model rules are complementary: `converged` asks for near-certainty that nothing is
// better at all, `no_likely_improvement` for near-certainty that nothing is better by a margin
// that matters.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "autopar/search/state.h"

namespace autopar::search {

enum class StopReason {
  kNone,
  kExhausted,
  kMaxTrials,
  kBudget,
  kConverged,
  kNoLikelyImprovement,
  kNoiseLimited,
};
const char* ToString(StopReason r);  // none, exhausted, max_trials, budget, converged, ...

struct StopSettings {
  int64_t max_trials = 0;        // 0: no limit
  double budget_s = 8 * 3600.0;  // 0: no limit
  // The wall time the next trial is expected to take (start-up included): the budget rule fires
  // once elapsed_s + next_trial_s reaches budget_s, so no trial starts that cannot end within
  // the budget. 0 (replay, the built-in runner): the budget alone.
  double next_trial_s = 0;
  int draws = 200;
  // A study stops more than ε from the best about as often as its claim at the stop says (the
  // rule is calibrated, docs/search.md §8): on the held-out worlds with 20 seeds, at 0.95 / 1%
  // 27 of 1,336 posterior stops (up to 13% off), at 0.99 / 0.2% 7 of 1,230, for studies about
  // 40% longer (§11, session 28).
  double converged_fraction = 0.99;
  double epsilon = 0.02;
  double delta = 0.002;
  int64_t min_measured = 5;
  int recent = 3;
  double recent_bound = 2.0;
  int64_t min_checks = 2;
  int calibration_window = 5;
  double calibration_dof = 2.0;
  // How many of the unmeasured configurations likeliest to beat the recommendation the model
  // rules report (StopCheck::likeliest_unmeasured).
  int report_unmeasured = 5;
};

// An unmeasured configuration the search may still propose, and the probability that it beats
// the recommendation by more than ε and fits (over the same draws as the rules).
struct OpenCandidate {
  int64_t candidate = -1;
  double p_better = 0;
};

struct StopCheck {
  StopReason reason = StopReason::kNone;
  // From the model rules' draws (NaN when they were not evaluated): the probability that no
  // other configuration is faster than the recommendation, and that one is faster by more than ε.
  double on_measured = std::numeric_limits<double>::quiet_NaN();
  double p_improvement = std::numeric_limits<double>::quiet_NaN();
  // The same without the contenders not worth measuring again (noise_limited).
  double on_measured_open = std::numeric_limits<double>::quiet_NaN();
  double p_improvement_open = std::numeric_limits<double>::quiet_NaN();
  // The largest |standardised error| of the last `recent` measurements (NaN when not checked).
  double recent_error = std::numeric_limits<double>::quiet_NaN();
  // The calibration scale the draws were widened by (1 when they were not evaluated).
  double calibration = 1;
  // Where p_improvement's doubt lies: the eligible configurations with the largest p_better, at
  // most report_unmeasured, largest first (empty when the rules were not evaluated). Each is at
  // most p_improvement; their sum against it says how concentrated the doubt is.
  std::vector<OpenCandidate> likeliest_unmeasured;
};

// max(1, √((ν + Σ e²)/(ν + n))) over the last `window` (n at most) of `errors`: how many times
// wider than the posterior's the spread is that its checks show, ν pseudo-errors of 1 its prior.
double CalibrationScale(const std::vector<double>& errors, int window, double dof);

// `trials_done` is the number of finished trials, `elapsed_s` the study's tuning time so far.
// Throws std::invalid_argument on settings out of range.
StopCheck CheckStop(const SearchState& state, const StopSettings& settings, bool model_rules,
                    uint64_t seed, int64_t trials_done, double elapsed_s);

// The model rules' probabilities alone (reason left kNone). Exposed for the tests.
StopCheck EvaluateDraws(const SearchState& state, const StopSettings& settings, uint64_t seed,
                        int64_t trials_done);

}  // namespace autopar::search
