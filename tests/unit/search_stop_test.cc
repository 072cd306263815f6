#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autopar/search/searcher.h"
#include "autopar/search/stop.h"
#include "search_test_util.h"

namespace autopar::search {
namespace {

using autopar::testing::Llama7bCase;

TEST(Stop, LimitsComeFirst) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  StopSettings st;
  EXPECT_EQ(CheckStop(s, st, true, 0, 0, 0).reason, StopReason::kNone);
  st.max_trials = 3;
  EXPECT_EQ(CheckStop(s, st, true, 0, 3, 0).reason, StopReason::kMaxTrials);
  EXPECT_EQ(CheckStop(s, st, true, 0, 2, 0).reason, StopReason::kNone);
  st.budget_s = 60;
  EXPECT_EQ(CheckStop(s, st, true, 0, 1, 61).reason, StopReason::kBudget);
  st.draws = 0;
  EXPECT_THROW(CheckStop(s, st, true, 0, 0, 0), std::invalid_argument);
}

// The candidates in the analytic model's order, fastest first.
std::vector<int64_t> FastestFirst(const CandidateSet& cs) {
  std::vector<int64_t> order(cs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return cs.nominal_time_s(a) < cs.nominal_time_s(b); });
  return order;
}

TEST(Stop, ExhaustedWhenNothingIsEligible) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  int64_t trial = 0;
  for (int64_t i = 0; i < cs.size(); ++i) {
    // Two failures retire a configuration as surely as a measurement, and cost no regression.
    for (int k = 0; k < 2 && s.eligible(i); ++k) s.Observe({i, Outcome::kTimeout});
    ++trial;
  }
  EXPECT_EQ(s.eligible_count(), 0);
  EXPECT_EQ(CheckStop(s, StopSettings{}, true, 0, trial, 0).reason, StopReason::kExhausted);
}

// When the model is exact and the truly fastest configurations are measured, the draws land on
// them and the search converges; after one trial it has not.
TEST(Stop, ConvergesOnceTheFastestAreMeasured) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  const std::vector<int64_t> order = FastestFirst(cs);
  StopSettings st;
  st.min_measured = 1;
  int64_t trials = 0;
  for (int64_t i : order) {
    if (!s.eligible(i)) continue;
    s.Observe({i, Outcome::kOk, cs.nominal_time_s(i), cs.nominal_memory_gib(i)});
    ++trials;
    if (trials == 1) {
      const StopCheck first = CheckStop(s, st, true, 1, trials, 0);
      EXPECT_EQ(first.reason, StopReason::kNone) << first.on_measured;
    }
    if (trials == 25) break;
  }
  const StopCheck check = CheckStop(s, st, true, 1, trials, 0);
  EXPECT_NE(check.reason, StopReason::kNone)
      << "on_measured " << check.on_measured << " p_improvement " << check.p_improvement;
  EXPECT_GE(check.on_measured, 0.5);
  // Same inputs, same decision; the model rules are skipped for baselines.
  EXPECT_EQ(CheckStop(s, st, true, 1, trials, 0).on_measured, check.on_measured);
  EXPECT_EQ(CheckStop(s, st, false, 1, trials, 0).reason, StopReason::kNone);
  st.min_measured = 1000;
  EXPECT_EQ(CheckStop(s, st, true, 1, trials, 0).reason, StopReason::kNone);
}

// The model rules do not fire while the posterior is being surprised: a last measurement far
// outside its predictive vetoes a stop the draws alone would make.
TEST(Stop, ARecentSurpriseVetoesTheModelRules) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  const std::vector<int64_t> order = FastestFirst(cs);
  StopSettings st;
  st.min_measured = 1;
  auto run = [&](double last_factor) {
    SearchState s(cs, SearchSettings::Default(cs));
    int64_t trials = 0;
    for (int64_t i : order) {
      if (!s.eligible(i)) continue;
      ++trials;
      const double factor = trials == 25 ? last_factor : 1.0;
      s.Observe({i, Outcome::kOk, factor * cs.nominal_time_s(i), cs.nominal_memory_gib(i)});
      if (trials == 25) break;
    }
    return CheckStop(s, st, true, 1, trials, 0);
  };
  const StopCheck calm = run(1.0);
  EXPECT_NE(calm.reason, StopReason::kNone);
  EXPECT_LT(calm.recent_error, st.recent_bound);
  const StopCheck surprised = run(1.6);  // the 25th is 60% slower than the model says
  EXPECT_GT(surprised.recent_error, st.recent_bound);
  EXPECT_EQ(surprised.reason, StopReason::kNone);
}

TEST(Stop, ReasonNames) {
  EXPECT_STREQ(ToString(StopReason::kConverged), "converged");
  EXPECT_STREQ(ToString(StopReason::kNoLikelyImprovement), "no_likely_improvement");
  EXPECT_STREQ(ToString(StopReason::kExhausted), "exhausted");
}

}  // namespace
}  // namespace autopar::search
