#include "autopar/search/stop.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "autopar/search/math.h"
#include "autopar/search/rng.h"

namespace autopar::search {
namespace {

void Validate(const StopSettings& s) {
  if (s.max_trials < 0) throw std::invalid_argument("max_trials must be >= 0");
  if (!(s.budget_s >= 0)) throw std::invalid_argument("budget_s must be >= 0");
  if (!(s.next_trial_s >= 0)) throw std::invalid_argument("next_trial_s must be >= 0");
  if (s.draws < 1) throw std::invalid_argument("stop draws must be >= 1");
  if (!(s.converged_fraction > 0 && s.converged_fraction <= 1)) {
    throw std::invalid_argument("converged_fraction must be in (0, 1]");
  }
  if (!(s.epsilon >= 0 && s.epsilon < 1)) throw std::invalid_argument("epsilon must be in [0, 1)");
  if (!(s.delta > 0 && s.delta <= 1)) throw std::invalid_argument("delta must be in (0, 1]");
  if (s.recent < 0) throw std::invalid_argument("recent must be >= 0");
  if (s.min_checks < 0) throw std::invalid_argument("min_checks must be >= 0");
  if (s.calibration_window < 1) throw std::invalid_argument("calibration_window must be >= 1");
  if (!(s.calibration_dof > 0)) throw std::invalid_argument("calibration_dof must be > 0");
  if (!(s.recent_bound > 0)) throw std::invalid_argument("recent_bound must be > 0");
  if (s.report_unmeasured < 0) throw std::invalid_argument("report_unmeasured must be >= 0");
}

// Keeps `open` the `k` entries with the largest p_better, largest first.
void KeepLikeliest(std::vector<OpenCandidate>& open, OpenCandidate c, size_t k) {
  if (k == 0 || !(c.p_better > 0) || (open.size() == k && c.p_better <= open.back().p_better)) {
    return;
  }
  const auto at = std::upper_bound(
      open.begin(), open.end(), c,
      [](const OpenCandidate& a, const OpenCandidate& b) { return a.p_better > b.p_better; });
  open.insert(at, c);
  if (open.size() > k) open.pop_back();
}

// Candidate i's step time under each of the `draws` draws of θ (laid out coefficient-major,
// theta[k * draws + j]), into t; the interactions only where some draw has them.
void DrawTimes(const CandidateSet& cs, int64_t i, const std::vector<double>& theta, int draws,
               bool interactions, std::vector<double>& t) {
  auto column = [&](int k) { return theta.data() + static_cast<ptrdiff_t>(k) * draws; };
  std::copy(column(kIntercept), column(kIntercept) + draws, t.begin());
  const double scale = cs.nominal_time_s(i);
  auto add = [&](int k, double x) {
    const double* th = column(k);
    for (int j = 0; j < draws; ++j) t[j] += x * th[j];
  };
  for (int k = 0; k < kNumFeatures; ++k) {
    if (cs.feature(i, k) != 0) add(k, cs.feature(i, k));
  }
  for (int q = 0; q < cs.varying_knobs(); ++q) add(cs.level_coefficient(i, q), scale);
  for (int p = 0; interactions && p < cs.num_pairs(); ++p) {
    add(static_cast<int>(cs.interaction_coefficient(i, p)), scale);
  }
}

}  // namespace

const char* ToString(StopReason r) {
  switch (r) {
    case StopReason::kNone:
      return "none";
    case StopReason::kExhausted:
      return "exhausted";
    case StopReason::kMaxTrials:
      return "max_trials";
    case StopReason::kBudget:
      return "budget";
    case StopReason::kConverged:
      return "converged";
    case StopReason::kNoLikelyImprovement:
      return "no_likely_improvement";
    case StopReason::kNoiseLimited:
      return "noise_limited";
  }
  return "?";
}

double CalibrationScale(const std::vector<double>& errors, int window, double dof) {
  const size_t n = std::min<size_t>(errors.size(), static_cast<size_t>(std::max(window, 0)));
  double sum = dof;
  for (size_t k = errors.size() - n; k < errors.size(); ++k) sum += errors[k] * errors[k];
  return std::max(1.0, std::sqrt(sum / (dof + static_cast<double>(n))));
}

StopCheck EvaluateDraws(const SearchState& state, const StopSettings& settings, uint64_t seed,
                        int64_t trials_done) {
  StopCheck check;
  const CandidateSet& cs = state.candidates();
  const double best = state.best_time_s();
  if (!std::isfinite(best)) return check;
  const int draws = settings.draws;
  // Draws laid out coefficient-major (theta[k * draws + j]) so the inner loops run over draws.
  Rng rng(seed, trials_done, Purpose::kStopCheck);
  const int d = state.time().dim();
  std::vector<double> theta(static_cast<size_t>(d) * draws), sigma(draws), one(d);
  // σ of a draw is the residual of the model, measurement noise included; what an unmeasured
  // configuration may deviate from the model by is the residual less the noise σ_m (a floor of a
  // tenth of it keeps the rule from trusting the model exactly).
  const double noise = state.measurement_noise_sd();
  // Each draw widened about the posterior mean by what the check trials show (stop.h).
  const double widen =
      CalibrationScale(state.check_errors(), settings.calibration_window, settings.calibration_dof);
  check.calibration = widen;
  for (int j = 0; j < draws; ++j) {
    const double s = widen * state.time().Draw(rng, one.data(), false, widen);
    sigma[j] = std::sqrt(std::max(s * s - noise * noise, 0.01 * s * s));
    for (int k = 0; k < d; ++k) theta[static_cast<size_t>(k) * draws + j] = one[k];
  }
  // Draws from hypotheses without interactions hold them at 0: when every draw does, skip them.
  const ptrdiff_t first = static_cast<ptrdiff_t>(kNumCoefficients + cs.num_levels()) * draws;
  const auto first_interaction = theta.begin() + first;
  const bool interactions =
      std::any_of(first_interaction, theta.end(), [](double v) { return v != 0; });
  // The recommendation's own time is an estimate too (state.h): each draw takes one value of it.
  // log Π_i P(y_i ≥ τ) per draw for τ = that value (converged) and (1 − ε)·τ (improvement).
  const SearchState::Estimate rec = state.Estimated(state.best());
  std::vector<double> thresholds[2] = {std::vector<double>(draws), std::vector<double>(draws)};
  for (int j = 0; j < draws; ++j) {
    thresholds[0][j] = rec.sd_s > 0 ? rec.mean_s + rec.sd_s * rng.Normal() : best;
    thresholds[1][j] = (1 - settings.epsilon) * thresholds[0][j];
  }
  // Two sums per threshold: what more trials can still settle (the unmeasured configurations and
  // the contenders that can be measured again) and what they cannot (the contenders measured as
  // often as the study allows: their estimates are as known as they will be).
  std::vector<double> log_none[2] = {std::vector<double>(draws, 0.0),
                                     std::vector<double>(draws, 0.0)};
  std::vector<double> log_settled[2] = {std::vector<double>(draws, 0.0),
                                        std::vector<double>(draws, 0.0)};
  // P(y ≥ τ) for a normal y = N(mean, sd²), summed in the log: below z = -8 it is 1 − 1e-15 and
  // the candidate cannot matter. 1 − p_fit·Φ(z) as (1 − p_fit) + p_fit·Φ(−z) keeps the small
  // tail exact. Returns p_fit·Φ(z), the probability that y fits and beats τ.
  auto add_to = [&](std::vector<double>* sums, int r, int j, double mean, double sd, double p_fit) {
    const double z = (thresholds[r][j] - mean) / sd;
    if (!(z > -8)) return 0.0;
    const double above = NormalCdf(-z);
    sums[r][j] += std::log(std::max((1 - p_fit) + p_fit * above, 1e-300));
    return p_fit * (1 - above);
  };
  // The other contenders: their estimates against τ. A doubt between two of them is settled
  // when measuring either again would not tell more (SearchState::worth_repeating).
  const bool best_settled = !state.worth_repeating(state.best());
  for (int64_t c : state.contenders()) {
    if (c == state.best()) continue;
    const SearchState::Estimate e = state.Estimated(c);
    if (!(e.sd_s > 0)) continue;
    std::vector<double>* sums = best_settled && !state.worth_repeating(c) ? log_settled : log_none;
    for (int r = 0; r < 2; ++r) {
      for (int j = 0; j < draws; ++j) add_to(sums, r, j, e.mean_s, e.sd_s, 1.0);
    }
  }
  std::vector<double> t(draws);
  for (int64_t i = 0; i < cs.size(); ++i) {
    if (!state.eligible(i)) continue;
    DrawTimes(cs, i, theta, draws, interactions, t);
    const double scale = cs.nominal_time_s(i);
    // It can only beat τ if it fits.
    const double p_fit = 1 - state.POom(i);
    for (int j = 0; j < draws; ++j) add_to(log_none, 0, j, t[j], scale * sigma[j], p_fit);
    double better = 0;
    for (int j = 0; j < draws; ++j) better += add_to(log_none, 1, j, t[j], scale * sigma[j], p_fit);
    KeepLikeliest(check.likeliest_unmeasured, {i, better / draws},
                  static_cast<size_t>(settings.report_unmeasured));
  }
  double on_measured = 0, improving = 0, on_measured_open = 0, improving_open = 0;
  for (int j = 0; j < draws; ++j) {
    on_measured += std::exp(log_none[0][j] + log_settled[0][j]);
    improving += 1 - std::exp(log_none[1][j] + log_settled[1][j]);
    on_measured_open += std::exp(log_none[0][j]);
    improving_open += 1 - std::exp(log_none[1][j]);
  }
  check.on_measured = on_measured / draws;
  check.p_improvement = improving / draws;
  check.on_measured_open = on_measured_open / draws;
  check.p_improvement_open = improving_open / draws;
  return check;
}

StopCheck CheckStop(const SearchState& state, const StopSettings& settings, bool model_rules,
                    uint64_t seed, int64_t trials_done, double elapsed_s) {
  Validate(settings);
  StopCheck check;
  if (state.eligible_count() == 0) {
    check.reason = StopReason::kExhausted;
    return check;
  }
  if (settings.max_trials > 0 && trials_done >= settings.max_trials) {
    check.reason = StopReason::kMaxTrials;
    return check;
  }
  if (settings.budget_s > 0 && elapsed_s + settings.next_trial_s >= settings.budget_s) {
    check.reason = StopReason::kBudget;
    return check;
  }
  if (!model_rules || state.measured_count() < settings.min_measured) return check;
  // Nor before the repeats that tell the noise (state.h): a study that has not seen its noise
  // would stop on one lucky measurement.
  if (state.settings().learn_time && state.repeats() < state.settings().confirm_repeats &&
      state.repeatable(state.best())) {
    return check;
  }
  // Nor before the check trials that test the posterior away from its own picks (stop.h).
  if (state.settings().learn_time && state.settings().check_every > 0 &&
      static_cast<int64_t>(state.check_errors().size()) < settings.min_checks) {
    return check;
  }
  check = EvaluateDraws(state, settings, seed, trials_done);
  // The model rules trust the posterior only while it predicts what is measured.
  const std::vector<double>& errors = state.time_errors();
  check.recent_error = 0;
  for (size_t k = errors.size() - std::min<size_t>(errors.size(), settings.recent);
       k < errors.size(); ++k) {
    check.recent_error = std::max(check.recent_error, std::abs(errors[k]));
  }
  if (check.recent_error > settings.recent_bound) return check;
  if (check.on_measured >= settings.converged_fraction) {
    check.reason = StopReason::kConverged;
  } else if (check.p_improvement < settings.delta) {
    check.reason = StopReason::kNoLikelyImprovement;
  } else if (check.on_measured_open >= settings.converged_fraction ||
             check.p_improvement_open < settings.delta) {
    check.reason = StopReason::kNoiseLimited;
  }
  return check;
}

}  // namespace autopar::search
