#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "autopar/common/status.h"
#include "autopar/search/searcher.h"
#include "autopar/search/stop.h"
#include "search_test_util.h"

namespace autopar::search {
namespace {

using autopar::testing::Llama7bCase;
using autopar::testing::SyntheticTruth;

// Runs `trials` proposals of `searcher` against `truth`; returns the proposed candidates.
std::vector<int64_t> RunTrials(const CandidateSet& cs, const Searcher& searcher, uint64_t seed,
                               const std::vector<double>& truth, int trials, SearchState* state) {
  std::vector<int64_t> proposed;
  for (int t = 0; t < trials; ++t) {
    const auto next = searcher.Propose(*state, seed, t);
    if (!next) break;
    proposed.push_back(*next);
    state->Observe({*next, Outcome::kOk, truth[*next], cs.nominal_memory_gib(*next)});
  }
  return proposed;
}

TEST(Thompson, SameSeedSameProposalsDifferentSeedDifferent) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  ASSERT_GT(cs.size(), 100);
  const SyntheticTruth truth(cs, 11);
  ThompsonSearcher ts;
  SearchState a(cs, SearchSettings::Default(cs)), b(cs, SearchSettings::Default(cs)),
      other(cs, SearchSettings::Default(cs));
  const auto pa = RunTrials(cs, ts, 42, truth.step_time_s, 15, &a);
  const auto pb = RunTrials(cs, ts, 42, truth.step_time_s, 15, &b);
  const auto po = RunTrials(cs, ts, 43, truth.step_time_s, 15, &other);
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(a.Digest(), b.Digest());
  EXPECT_NE(pa, po);
  EXPECT_NE(a.Digest(), other.Digest());
}

TEST(Thompson, ReplayingObservationsGivesTheSameNextProposal) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  const SyntheticTruth truth(cs, 3);
  ThompsonSearcher ts;
  SearchState live(cs, SearchSettings::Default(cs));
  RunTrials(cs, ts, 9, truth.step_time_s, 8, &live);
  SearchState replayed(cs, SearchSettings::Default(cs));
  for (const Observation& o : live.history()) replayed.Observe(o);
  EXPECT_EQ(live.Digest(), replayed.Digest());
  EXPECT_EQ(ts.Propose(live, 9, 8), ts.Propose(replayed, 9, 8));
  EXPECT_EQ(live.time().mean(), replayed.time().mean());
}

TEST(Thompson, LearnsAMisSpecifiedModelAndFindsTheOptimum) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  const SyntheticTruth truth(cs, 5, /*noise=*/0.0);
  SearchState state(cs, SearchSettings::Default(cs));
  // The best configuration among those the memory prior allows at all.
  double best = 1e300;
  for (int64_t i = 0; i < cs.size(); ++i) {
    if (state.eligible(i)) best = std::min(best, truth.step_time_s[i]);
  }
  ThompsonSearcher ts;
  const auto proposed = RunTrials(cs, ts, 1, truth.step_time_s, 40, &state);
  EXPECT_LE(state.best_time_s(), 1.02 * best);
  // The posterior recovered the truth's scale on the dominant feature.
  EXPECT_LT(state.time().noise_sd(), 0.05);
}

TEST(Baselines, GridRandomAnalyticOrders) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState state(cs, SearchSettings::Default(cs));
  GridSearcher grid;
  int64_t first_eligible = 0;
  while (!state.eligible(first_eligible)) ++first_eligible;
  EXPECT_EQ(grid.Propose(state, 0, 0), first_eligible);

  AnalyticSearcher analytic(cs);
  const int64_t pick = *analytic.Propose(state, 0, 0);
  for (int64_t i = 0; i < cs.size(); ++i) {
    if (state.eligible(i)) {
      EXPECT_LE(cs.nominal_time_s(pick), cs.nominal_time_s(i));
    }
  }

  RandomSearcher random;
  std::vector<int64_t> picks;
  for (int t = 0; t < 20; ++t) picks.push_back(*random.Propose(state, 5, t));
  std::sort(picks.begin(), picks.end());
  EXPECT_GT(std::unique(picks.begin(), picks.end()) - picks.begin(), 10);
  EXPECT_EQ(random.Propose(state, 5, 3), random.Propose(state, 5, 3));

  EXPECT_THROW(MakeSearcher("bayes", cs), InputError);
  EXPECT_STREQ(MakeSearcher("analytic", cs)->name(), "analytic");
}

TEST(Rng, StreamsArePureFunctionsOfSeedIndexPurpose) {
  Rng a(1, 2, Purpose::kProposal), b(1, 2, Purpose::kProposal), c(1, 2, Purpose::kStopCheck),
      d(1, 3, Purpose::kProposal);
  const uint64_t x = a.Bits();
  EXPECT_EQ(x, b.Bits());
  EXPECT_NE(x, c.Bits());
  EXPECT_NE(x, d.Bits());
  Rng g(4, 0, Purpose::kSynthetic);
  double sum = 0;
  for (int i = 0; i < 20000; ++i) sum += g.Gamma(2.5);
  EXPECT_NEAR(sum / 20000, 2.5, 0.05);
}

}  // namespace
}  // namespace autopar::search
