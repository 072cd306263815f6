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
  // A real trial's expected time (start-up included) counts: none starts that cannot end in
  // the budget (--backend megatron, docs/trial.md §17).
  st.next_trial_s = 15;
  EXPECT_EQ(CheckStop(s, st, true, 0, 1, 40).reason, StopReason::kNone);
  EXPECT_EQ(CheckStop(s, st, true, 0, 1, 46).reason, StopReason::kBudget);
  st.next_trial_s = 0;
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
  // The model rules wait for the repeats that tell the noise (here exact).
  for (int64_t r = 0; r < s.settings().confirm_repeats; ++r) {
    EXPECT_EQ(CheckStop(s, st, true, 1, trials, 0).reason, StopReason::kNone);
    s.Observe({s.best(), Outcome::kOk, s.measured_time_s(s.best()),
               cs.nominal_memory_gib(s.best())});
    ++trials;
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

// The rules say where the doubt they leave lies: the unmeasured configurations likeliest to beat
// the recommendation by more than ε, largest first, each at most the probability that some
// configuration does. With the model exact, the analytic model's fastest, left unmeasured, leads.
TEST(Stop, ReportsTheUnmeasuredLikeliestToBeBetter) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  const std::vector<int64_t> order = FastestFirst(cs);
  for (size_t k = 1; k <= 6; ++k) {
    const int64_t i = order[k];
    s.Observe({i, Outcome::kOk, cs.nominal_time_s(i), cs.nominal_memory_gib(i)});
  }
  StopSettings st;
  const StopCheck check = EvaluateDraws(s, st, 3, s.trials());
  const std::vector<OpenCandidate>& open = check.likeliest_unmeasured;
  ASSERT_EQ(open.size(), static_cast<size_t>(st.report_unmeasured));
  EXPECT_EQ(open.front().candidate, order[0]);
  for (size_t k = 0; k < open.size(); ++k) {
    EXPECT_TRUE(s.eligible(open[k].candidate) && !s.measured(open[k].candidate)) << k;
    EXPECT_GT(open[k].p_better, 0) << k;
    EXPECT_LE(open[k].p_better, check.p_improvement + 1e-12) << k;
    if (k > 0) {
      EXPECT_GE(open[k - 1].p_better, open[k].p_better) << k;
    }
  }
  // The report leaves the decision as it was.
  st.report_unmeasured = 0;
  const StopCheck quiet = EvaluateDraws(s, st, 3, s.trials());
  EXPECT_TRUE(quiet.likeliest_unmeasured.empty());
  EXPECT_EQ(quiet.p_improvement, check.p_improvement);
  EXPECT_EQ(quiet.on_measured, check.on_measured);
  st.report_unmeasured = -1;
  EXPECT_THROW(CheckStop(s, st, true, 3, s.trials(), 0), std::invalid_argument);
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
      if (trials == 5 || trials == 10) {  // the repeats that tell the noise
        s.Observe({s.best(), Outcome::kOk, s.measured_time_s(s.best()),
                   cs.nominal_memory_gib(s.best())});
      }
    }
    return CheckStop(s, st, true, 1, trials, 0);
  };
  const StopCheck calm = run(1.0);
  EXPECT_NE(calm.reason, StopReason::kNone)
      << "on_measured " << calm.on_measured << " p_improvement " << calm.p_improvement;
  EXPECT_LT(calm.recent_error, st.recent_bound);
  const StopCheck surprised = run(1.6);  // the 25th is 60% slower than the model says
  EXPECT_GT(surprised.recent_error, st.recent_bound);
  EXPECT_EQ(surprised.reason, StopReason::kNone);
}

// Configurations whose measurements are 8% noisy and whose means are equal: what is in doubt is
// between them alone. While they can be measured again, the search goes on; once all are measured
// as often as the study allows, it stops as noise_limited, and says how unsure it is. They are the
// configurations the model ties with the fastest (here the micro-batch sizes of one layout): a tie
// left among the exactly measured others would be a contender measured once, still in doubt.
TEST(Stop, NoiseLimitedOnceOnlySettledContendersAreInDoubt) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  const std::vector<int64_t> order = FastestFirst(cs);
  std::vector<int64_t> tied;
  for (int64_t i : order) {
    if (cs.nominal_time_s(i) <= 1.001 * cs.nominal_time_s(order[0])) tied.push_back(i);
  }
  ASSERT_GE(tied.size(), 2U);
  StopSettings st;
  st.min_measured = 1;
  st.recent = 0;  // the others are exact: the noisy first measurements surprise the model
  const SearchSettings settings = SearchSettings::Default(cs);
  // The 30 fastest others measured exactly: enough of the field that the unmeasured are out of
  // doubt, few enough that the model does not pin the tied ones' times (25-40 do both). The last
  // of the tied is measured `measurements_of_last` times, the others max_measurements.
  auto run = [&](int measurements_of_last) {
    SearchState s(cs, settings);
    int64_t trials = 0;
    for (int64_t i : order) {
      if (std::find(tied.begin(), tied.end(), i) != tied.end() || !s.eligible(i)) continue;
      s.Observe({i, Outcome::kOk, cs.nominal_time_s(i), cs.nominal_memory_gib(i)});
      if (++trials == 30) break;
    }
    const double t = cs.nominal_time_s(order[0]);
    for (int k = 0; k < settings.max_measurements; ++k) {
      for (size_t j = 0; j < tied.size(); ++j) {
        if (j + 1 == tied.size() && k >= measurements_of_last) continue;
        const double noise = (k + j) % 2 == 0 ? 1.08 : 1 / 1.08;
        s.Observe({tied[j], Outcome::kOk, t * noise, cs.nominal_memory_gib(tied[j])});
        ++trials;
      }
    }
    return CheckStop(s, st, true, 1, trials, 0);
  };
  const StopCheck open = run(settings.max_measurements - 1);
  EXPECT_EQ(open.reason, StopReason::kNone)
      << "on_measured " << open.on_measured << " p_improvement " << open.p_improvement;
  const StopCheck settled = run(settings.max_measurements);
  EXPECT_EQ(settled.reason, StopReason::kNoiseLimited)
      << "on_measured " << settled.on_measured << " p_improvement " << settled.p_improvement
      << " open " << settled.on_measured_open << " " << settled.p_improvement_open;
  // The probabilities it reports are the honest ones, the settled contender included.
  EXPECT_GT(settled.p_improvement, st.delta);
  EXPECT_LT(settled.on_measured, st.converged_fraction);
  EXPECT_LT(settled.p_improvement_open, settled.p_improvement);
}

TEST(Stop, CalibrationScaleOfTheChecks) {
  EXPECT_EQ(CalibrationScale({}, 5, 2), 1);
  EXPECT_EQ(CalibrationScale({0.5, -0.3, 0.1}, 5, 2), 1);  // within the intervals: never < 1
  // √((2 + 5·9)/(2 + 5)) over the last five, the older error left out.
  EXPECT_NEAR(CalibrationScale({100, 3, -3, 3, -3, 3}, 5, 2), std::sqrt(47.0 / 7), 1e-12);
}

// The model rules wait for the check trials, and a posterior whose checks fall outside its
// intervals is widened by them: the same measurements elsewhere, it no longer stops.
TEST(Stop, ChecksOutsideTheIntervalsHoldTheStop) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  const std::vector<int64_t> order = FastestFirst(cs);
  StopSettings st;
  st.min_measured = 1;
  auto run = [&](double check_factor, int trials_wanted) {
    SearchState s(cs, SearchSettings::Default(cs));
    // The checks measure configurations far down the analytic order, the others the fastest.
    size_t fast = 0, slow = order.size() / 2;
    for (int64_t t = 0; t < trials_wanted; ++t) {
      if (t == 5 || t == 11) {  // the repeats that tell the noise
        s.Observe(
            {s.best(), Outcome::kOk, s.measured_time_s(s.best()), cs.nominal_memory_gib(s.best())});
        continue;
      }
      size_t& k = s.IsCheckTrial(t) ? slow : fast;
      while (!s.eligible(order[k])) ++k;
      const int64_t i = order[k];
      const double factor = s.IsCheckTrial(t) ? (t % 2 ? check_factor : 1 / check_factor) : 1.0;
      s.Observe({i, Outcome::kOk, factor * cs.nominal_time_s(i), cs.nominal_memory_gib(i)});
    }
    return CheckStop(s, st, true, 1, trials_wanted, 0);
  };
  // Before the second check (trial 10) the model rules are not evaluated.
  const StopCheck early = run(1.0, 9);
  EXPECT_EQ(early.reason, StopReason::kNone);
  EXPECT_TRUE(std::isnan(early.on_measured));
  const StopCheck calm = run(1.0, 30);
  EXPECT_NE(calm.reason, StopReason::kNone)
      << "on_measured " << calm.on_measured << " p_improvement " << calm.p_improvement;
  EXPECT_EQ(calm.calibration, 1);
  const StopCheck wrong = run(1.25, 30);  // the checks 25% off the model, either way
  EXPECT_GT(wrong.calibration, 2);
  EXPECT_EQ(wrong.reason, StopReason::kNone)
      << "on_measured " << wrong.on_measured << " p_improvement " << wrong.p_improvement;
  EXPECT_GT(wrong.p_improvement, calm.p_improvement);
  st.min_checks = -1;
  EXPECT_THROW(CheckStop(SearchState(cs, SearchSettings::Default(cs)), st, true, 0, 0, 0),
               std::invalid_argument);
}

TEST(Stop, ReasonNames) {
  EXPECT_STREQ(ToString(StopReason::kConverged), "converged");
  EXPECT_STREQ(ToString(StopReason::kNoLikelyImprovement), "no_likely_improvement");
  EXPECT_STREQ(ToString(StopReason::kExhausted), "exhausted");
  EXPECT_STREQ(ToString(StopReason::kNoiseLimited), "noise_limited");
}

}  // namespace
}  // namespace autopar::search
