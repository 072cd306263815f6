#include "autopar/search/searcher.h"

#include <algorithm>
#include <numeric>

#include "autopar/common/status.h"
#include "autopar/search/rng.h"

namespace autopar::search {

int64_t EligibleArgmin(const SearchState& state, const std::vector<double>& t) {
  const uint8_t* eligible = state.eligible_mask().data();
  int64_t best = -1;
  double best_t = 0;
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t i = 0; i < n; ++i) {
    if (eligible[i] && (best < 0 || t[i] < best_t)) {
      best = i;
      best_t = t[i];
    }
  }
  return best;
}

std::optional<int64_t> ThompsonSearcher::Propose(const SearchState& state, uint64_t seed,
                                                 int64_t trial_index) const {
  if (state.eligible_count() == 0) return std::nullopt;
  Rng rng(seed, trial_index, Purpose::kProposal);
  double theta[kNumCoefficients];
  state.time().Draw(rng, theta);
  std::vector<double> t;
  state.candidates().Predict(theta, &t);
  const int64_t best = EligibleArgmin(state, t);
  if (best < 0) return std::nullopt;
  return best;
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
