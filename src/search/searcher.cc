#include "autopar/search/searcher.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autopar/common/errors.h"
#include "autopar/search/math.h"
#include "autopar/search/rng.h"

namespace autopar::search {

int64_t EligibleArgmin(const SearchState& state, const std::vector<double>& t) {
  const uint8_t* eligible = state.eligible_mask().data();
  int64_t best = -1;
  double best_t = 0;
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t i = 0; i < n; ++i) {
    if (eligible[i] && t[i] < std::numeric_limits<double>::infinity() &&
        (best < 0 || t[i] < best_t)) {
      best = i;
      best_t = t[i];
    }
  }
  return best;
}

namespace {

// E[max(τ − t, 0)] for t ~ N(mean, sd²): what measuring the candidate is expected to gain on τ.
double ExpectedImprovement(double tau, double mean, double sd) {
  if (!(sd > 0)) return std::max(tau - mean, 0.0);
  const double z = (tau - mean) / sd;
  return (tau - mean) * NormalCdf(z) + sd * NormalPdf(z);
}

// The `count` eligible candidates of lowest t (fewer where fewer are eligible), appended to *out.
void AppendLowest(const SearchState& state, const std::vector<double>& t, int64_t count,
                  std::vector<int64_t>* out) {
  std::vector<int64_t> eligible;
  eligible.reserve(static_cast<size_t>(state.eligible_count()));
  for (int64_t i = 0; i < static_cast<int64_t>(t.size()); ++i) {
    if (state.eligible(i) && std::isfinite(t[i])) eligible.push_back(i);
  }
  const auto by_time = [&](int64_t a, int64_t b) { return t[a] < t[b] || (t[a] == t[b] && a < b); };
  const auto end = eligible.begin() + std::min<int64_t>(count, std::ssize(eligible));
  std::nth_element(eligible.begin(), end, eligible.end(), by_time);
  out->insert(out->end(), eligible.begin(), end);
}

}  // namespace

std::optional<int64_t> ThompsonSearcher::Propose(const SearchState& state, uint64_t seed,
                                                 int64_t trial_index) const {
  // The repeats that tell the noise: the recommendation, once it has held over confirm_after,
  // then 2·confirm_after, ... newly measured configurations (state.h).
  const SearchSettings& settings = state.settings();
  const int64_t incumbent = state.best();
  if (state.repeats() < settings.confirm_repeats &&
      state.best_unchanged_for() >= settings.confirm_after * (state.repeats() + 1) &&
      incumbent >= 0 && state.repeatable(incumbent)) {
    return incumbent;
  }
  Rng rng(seed, trial_index, Purpose::kProposal);
  const bool check = state.IsCheckTrial(trial_index);
  std::optional<int64_t> drawn = ThompsonDraw(state, rng, check);
  // A repeat picked by the draw gives way, with probability 1 − β, to the challenger: the pick of
  // a fresh draw that is not it (top-two Thompson sampling, Russo 2016; state.h).
  if (!check && drawn && state.measured(*drawn) && rng.Uniform() >= settings.top_two_beta) {
    for (int64_t k = 0; k < settings.top_two_redraws; ++k) {
      const std::optional<int64_t> challenger = ThompsonDraw(state, rng, /*check=*/false);
      if (challenger && *challenger != *drawn) {
        drawn = challenger;
        break;
      }
    }
  }
  // A check, a repeat, or nothing measured yet to improve on: the draw decides.
  if (check || settings.improvement_shortlist <= 0 || incumbent < 0 || !drawn ||
      state.measured(*drawn)) {
    return drawn;
  }
  // Otherwise the largest expected improvement on the recommendation among a shortlist: the
  // candidates of lowest posterior mean and the draw's pick (docs/search.md §6). The Gaussian
  // predictive of the model's value, weighted by the probability it fits.
  const CandidateSet& cs = state.candidates();
  std::vector<int64_t> shortlist{*drawn};
  std::vector<double> t;
  cs.Predict(state.time().mean().data(), &t);
  AppendLowest(state, t, settings.improvement_shortlist, &shortlist);
  std::sort(shortlist.begin(), shortlist.end());
  shortlist.erase(std::unique(shortlist.begin(), shortlist.end()), shortlist.end());
  const double tau = state.Estimated(incumbent).mean_s;
  int64_t best = *drawn;
  double best_gain = -1;
  for (int64_t i : shortlist) {
    const double p_oom = state.POom(i);
    if (i != *drawn && p_oom > settings.improvement_max_p_oom) continue;
    const TimePosterior::Relative z = state.time().Predict(cs, i, /*with_noise=*/false);
    const double nominal = cs.nominal_time_s(i);
    const double gain =
        (1 - p_oom) * ExpectedImprovement(tau, nominal * z.mean, nominal * std::sqrt(z.variance));
    if (gain > best_gain || (gain == best_gain && i < best)) best = i, best_gain = gain;
  }
  return best;
}

std::optional<int64_t> ThompsonSearcher::ThompsonDraw(const SearchState& state, Rng& rng,
                                                      bool check) {
  const SearchSettings& settings = state.settings();
  std::vector<double> theta(static_cast<size_t>(state.time().dim()));
  // A check trial (state.h): from a draw check_temper times wider, so the errors of what it
  // measures test the posterior where its own picks do not go (the stop rule's calibration).
  state.time().Draw(rng, theta.data(), check && settings.check_any_hypothesis,
                    check ? settings.check_temper : 1.0);
  // A contender worth measuring again takes part with a draw of its estimate: it is
  // measured again with the probability that it is the fastest.
  int64_t repeat = -1;
  double repeat_t = std::numeric_limits<double>::infinity();
  for (int64_t c : state.contenders()) {
    if (!state.worth_repeating(c)) continue;
    const SearchState::Estimate e = state.Estimated(c);
    const double drawn = e.mean_s + e.sd_s * rng.Normal();
    if (drawn < repeat_t) repeat = c, repeat_t = drawn;
  }
  if (state.eligible_count() == 0) {
    return repeat >= 0 ? std::optional<int64_t>(repeat) : std::nullopt;
  }
  std::vector<double> t;
  const CandidateSet& cs = state.candidates();
  cs.Predict(theta.data(), &t);
  // The fastest candidate of this world that also fits in it: the memory model is drawn too, and
  // a candidate whose drawn peak exceeds the capacity drops out of this draw (a candidate is thus
  // proposed with the probability that it is the fastest one that fits). Every rejection costs a
  // pass over the candidates; after kMaxRejections the draw keeps the fastest left.
  constexpr int kMaxRejections = 64;
  const MemoryPosterior::Sample memory = state.memory().Draw(rng);
  for (int rejected = 0;; ++rejected) {
    const int64_t best = EligibleArgmin(state, t);
    if (repeat >= 0 && (best < 0 || repeat_t <= t[best])) return repeat;
    if (best < 0) return std::nullopt;
    if (rejected == kMaxRejections ||
        memory.Fits(state.memory_row(best), cs.capacity_gib(), rng.Normal())) {
      return best;
    }
    t[best] = std::numeric_limits<double>::infinity();
  }
}

std::optional<int64_t> GridSearcher::Propose(const SearchState& state, uint64_t /*seed*/,
                                             int64_t /*trial_index*/) const {
  for (int64_t i = 0; i < state.candidates().size(); ++i) {
    if (state.eligible(i)) return i;
  }
  return std::nullopt;
}

std::optional<int64_t> RandomSearcher::Propose(const SearchState& state, uint64_t seed,
                                               int64_t trial_index) const {
  if (state.eligible_count() == 0) return std::nullopt;
  Rng rng(seed, trial_index, Purpose::kRandomSearch);
  int64_t k = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(state.eligible_count())));
  for (int64_t i = 0; i < state.candidates().size(); ++i) {
    if (state.eligible(i) && k-- == 0) return i;
  }
  return std::nullopt;
}

AnalyticSearcher::AnalyticSearcher(const CandidateSet& candidates) {
  order_.resize(candidates.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
    return candidates.nominal_time_s(a) < candidates.nominal_time_s(b);
  });
}

std::optional<int64_t> AnalyticSearcher::Propose(const SearchState& state, uint64_t /*seed*/,
                                                 int64_t /*trial_index*/) const {
  for (int64_t i : order_) {
    if (state.eligible(i)) return i;
  }
  return std::nullopt;
}

std::unique_ptr<Searcher> MakeSearcher(const std::string& name, const CandidateSet& candidates) {
  if (name == "thompson") return std::make_unique<ThompsonSearcher>();
  if (name == "random") return std::make_unique<RandomSearcher>();
  if (name == "grid") return std::make_unique<GridSearcher>();
  if (name == "analytic") return std::make_unique<AnalyticSearcher>(candidates);
  throw InputError("--searcher", "allowed: thompson, random, grid, analytic; got '" + name + "'");
}

}  // namespace autopar::search
