#include "autopar/search/stop.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "autopar/search/math.h"
#include "autopar/search/rng.h"

namespace autopar::search {
namespace {

void Validate(const StopSettings& s) {
  if (s.max_trials < 0) throw std::invalid_argument("max_trials must be >= 0");
  if (!(s.budget_s >= 0)) throw std::invalid_argument("budget_s must be >= 0");
  if (s.draws < 1) throw std::invalid_argument("stop draws must be >= 1");
  if (!(s.converged_fraction > 0 && s.converged_fraction <= 1)) {
    throw std::invalid_argument("converged_fraction must be in (0, 1]");
  }
  if (!(s.epsilon >= 0 && s.epsilon < 1)) throw std::invalid_argument("epsilon must be in [0, 1)");
  if (!(s.delta > 0 && s.delta <= 1)) throw std::invalid_argument("delta must be in (0, 1]");
  if (s.recent < 0) throw std::invalid_argument("recent must be >= 0");
  if (!(s.recent_bound > 0)) throw std::invalid_argument("recent_bound must be > 0");
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
  }
  return "?";
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
  for (int j = 0; j < draws; ++j) {
    sigma[j] = state.time().Draw(rng, one.data());
    for (int k = 0; k < d; ++k) theta[static_cast<size_t>(k) * draws + j] = one[k];
  }
  // Draws from hypotheses without interactions hold them at 0: when every draw does, skip them.
  const ptrdiff_t first = static_cast<ptrdiff_t>(kNumCoefficients + cs.num_levels()) * draws;
  const auto first_interaction = theta.begin() + first;
  const bool interactions =
      std::any_of(first_interaction, theta.end(), [](double v) { return v != 0; });
  // log Π_i P(y_i ≥ τ) per draw for τ = best (converged) and τ = (1 − ε)·best (improvement).
  const double thresholds[2] = {best, (1 - settings.epsilon) * best};
  std::vector<double> log_none[2] = {std::vector<double>(draws, 0.0),
                                     std::vector<double>(draws, 0.0)};
  std::vector<double> t(draws);
  for (int64_t i = 0; i < cs.size(); ++i) {
    if (!state.eligible(i)) continue;
    std::copy(theta.begin() + kIntercept * draws, theta.begin() + (kIntercept + 1) * draws,
              t.begin());
    const double scale = cs.nominal_time_s(i);
    // It can only beat τ if it fits.
    const double p_fit = 1 - state.POom(i);
    auto add = [&](int k, double x) {
      const double* th = theta.data() + static_cast<size_t>(k) * draws;
      for (int j = 0; j < draws; ++j) t[j] += x * th[j];
    };
    for (int k = 0; k < kNumFeatures; ++k) {
      if (cs.feature(i, k) != 0) add(k, cs.feature(i, k));
    }
    for (int q = 0; q < cs.varying_knobs(); ++q) add(cs.level_coefficient(i, q), scale);
    for (int p = 0; interactions && p < cs.num_pairs(); ++p) {
      add(static_cast<int>(cs.interaction_coefficient(i, p)), scale);
    }
    for (int r = 0; r < 2; ++r) {
      for (int j = 0; j < draws; ++j) {
        // P(i fits and y_i < τ) = p_fit·Φ(z); below z = -8 it is under 1e-15 and the candidate
        // cannot matter. 1 − p_fit·Φ(z) as (1 − p_fit) + p_fit·Φ(−z) keeps the small tail exact.
        const double z = (thresholds[r] - t[j]) / (scale * sigma[j]);
        if (z > -8) {
          log_none[r][j] += std::log(std::max((1 - p_fit) + p_fit * NormalCdf(-z), 1e-300));
        }
      }
    }
  }
  double on_measured = 0, improving = 0;
  for (int j = 0; j < draws; ++j) {
    on_measured += std::exp(log_none[0][j]);
    improving += 1 - std::exp(log_none[1][j]);
  }
  check.on_measured = on_measured / draws;
  check.p_improvement = improving / draws;
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
  if (settings.budget_s > 0 && elapsed_s >= settings.budget_s) {
    check.reason = StopReason::kBudget;
    return check;
  }
  if (!model_rules || state.measured_count() < settings.min_measured) return check;
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
  }
  return check;
}

}  // namespace autopar::search
