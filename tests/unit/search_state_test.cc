#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <stdexcept>

#include "autopar/search/searcher.h"
#include "autopar/search/state.h"
#include "search_test_util.h"

namespace autopar::search {
namespace {

using autopar::testing::Llama7bCase;

int64_t FirstEligible(const SearchState& s) {
  for (int64_t i = 0; i < s.candidates().size(); ++i) {
    if (s.eligible(i)) return i;
  }
  return -1;
}

TEST(SearchState, AConfigurationThatFailsTwiceIsNeverProposedAgain) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  const int64_t i = FirstEligible(s);
  const int64_t eligible = s.eligible_count();
  s.Observe({i, Outcome::kTimeout});
  EXPECT_TRUE(s.eligible(i));  // one failure: may be retried
  EXPECT_EQ(s.failures(i), 1);
  s.Observe({i, Outcome::kCommError});
  EXPECT_FALSE(s.eligible(i));
  EXPECT_TRUE(s.retired(i));
  EXPECT_EQ(s.eligible_count(), eligible - 1);
  // No searcher proposes it, whatever the seed.
  GridSearcher grid;
  EXPECT_NE(grid.Propose(s, 0, 2), i);
  ThompsonSearcher ts;
  for (int seed = 0; seed < 30; ++seed) EXPECT_NE(ts.Propose(s, seed, 2), i);
}

TEST(SearchState, OomPrunesConfigurationsThatNeedMore) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  // An eligible configuration with a larger-micro-batch sibling in the same layout.
  int64_t small = -1, big = -1, unrelated = -1;
  for (int64_t i = 0; i < cs.size() && big < 0; ++i) {
    if (!s.eligible(i)) continue;
    for (int64_t j = 0; j < cs.size(); ++j) {
      if (j != i && s.eligible(j) && cs.config(j).mbs > cs.config(i).mbs &&
          NeedsAtLeastAsMuchMemory(cs.config(j), cs.config(i))) {
        small = i;
        big = j;
        break;
      }
    }
  }
  ASSERT_GE(big, 0);
  for (int64_t j = 0; j < cs.size(); ++j) {
    if (s.eligible(j) && cs.config(j).tp != cs.config(small).tp) unrelated = j;
  }
  ASSERT_GE(unrelated, 0);
  s.Observe({small, Outcome::kOom});
  EXPECT_FALSE(s.eligible(small));
  EXPECT_TRUE(s.pruned(big));
  EXPECT_FALSE(s.eligible(big));
  EXPECT_FALSE(s.pruned(unrelated));
}

// Selective recompute and none store the same tensors under flash attention: the model gives
// them one peak, so which of the two is higher on a device is the allocator's doing. An OOM of
// one leaves the other to the memory posterior instead of pruning it.
TEST(SearchState, OomLeavesASiblingOfTheSamePredictedPeak) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  int64_t selective = -1, none = -1;
  for (int64_t i = 0; i < cs.size() && none < 0; ++i) {
    if (!s.eligible(i) || cs.config(i).recompute != Recompute::kSelective) continue;
    ParallelConfig sibling = cs.config(i);
    sibling.recompute = Recompute::kNone;
    const std::optional<int64_t> j = cs.Find(sibling);
    if (j && s.eligible(*j) && cs.nominal_memory_gib(*j) == cs.nominal_memory_gib(i)) {
      selective = i;
      none = *j;
    }
  }
  ASSERT_GE(none, 0);
  ASSERT_TRUE(NeedsAtLeastAsMuchMemory(cs.config(none), cs.config(selective)));
  s.Observe({selective, Outcome::kOom});
  EXPECT_FALSE(s.eligible(selective));
  EXPECT_FALSE(s.pruned(none));
}

TEST(SearchState, MemoryDominanceFollowsTheKnobs) {
  const ParallelConfig base =
      ParseSpec("tp=2,pp=2,dp=4,mbs=2,recompute=selective,sp=on,dist_opt=on");
  auto with = [&](const std::string& spec) { return ParseSpec(spec); };
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(base, base));
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,mbs=4,recompute=selective,sp=on,dist_opt=on"), base));
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,mbs=2,recompute=none,sp=off,dist_opt=off"), base));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,mbs=1,recompute=selective,sp=on,dist_opt=on"), base));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,mbs=2,recompute=full,sp=on,dist_opt=on"), base));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(
      with("tp=4,pp=2,dp=2,mbs=8,recompute=none,sp=off,dist_opt=off"), base));
  // 16-bit gradient buffers and FP8 parameters (no 16-bit copy) hold less.
  const std::string dist = "tp=2,pp=2,dp=4,dist_opt=on";
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(with(dist), with(dist + ",grad_reduce_dtype=bf16")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(with(dist + ",grad_reduce_dtype=bf16"), with(dist)));
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(with(dist), with(dist + ",fp8_param_gather=on")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(with(dist + ",fp8_param_gather=on"), with(dist)));
  // Full recompute of fewer layers keeps more.
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(with("tp=2,pp=2,dp=4,recompute=full,recompute_layers=2"),
                                       with("tp=2,pp=2,dp=4,recompute=full")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(with("tp=2,pp=2,dp=4,recompute=full"),
                                        with("tp=2,pp=2,dp=4,recompute=full,recompute_layers=2")));
  // Selective recompute of fewer modules keeps more; of other modules, nothing is known.
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=core_attn"),
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=core_attn+mlp")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=core_attn+mlp"),
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=core_attn")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=mlp"),
      with("tp=2,pp=2,dp=4,recompute=selective,recompute_modules=core_attn")));
  // Another stage split moves the peak between stages: no order by construction.
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(with("tp=2,pp=4,dp=2,mbs=4,pp_first=2,pp_last=2"),
                                        with("tp=2,pp=4,dp=2,mbs=2")));
  EXPECT_FALSE(NeedsAtLeastAsMuchMemory(with("tp=2,pp=4,dp=2,mbs=4,split_loss=on"),
                                        with("tp=2,pp=4,dp=2,mbs=2")));
  EXPECT_TRUE(NeedsAtLeastAsMuchMemory(with("tp=2,pp=4,dp=2,mbs=4,pp_first=2,pp_last=2"),
                                       with("tp=2,pp=4,dp=2,mbs=2,pp_first=2,pp_last=2")));
}

TEST(SearchState, MeasuredPeaksMoveTheMemoryFit) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  const int64_t before = s.eligible_count();
  // Every measurement shows 30% more memory than the model: near-capacity configs drop out.
  int done = 0;
  for (int64_t i = 0; i < cs.size() && done < 6; ++i) {
    if (!s.eligible(i)) continue;
    s.Observe({i, Outcome::kOk, cs.nominal_time_s(i), 1.3 * cs.nominal_memory_gib(i)});
    ++done;
  }
  EXPECT_LT(s.eligible_count(), before - done);
  EXPECT_NEAR(s.memory().scale(), 1.3, 0.1);
}

// Repeated measurements (docs/search.md §7a): the noise is learnt from the repeats alone, a
// configuration's measured time is its mean, a lucky single measurement does not decide the
// recommendation once the noise is known, and exact repeats make one measurement enough.
TEST(SearchState, RepeatsTellTheNoiseAndTheRecommendation) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  auto measure_all = [&](SearchState& s, int64_t a, int64_t b, double noise) {
    const double t = cs.nominal_time_s(a);
    s.Observe({a, Outcome::kOk, t});
    s.Observe({b, Outcome::kOk, t * 0.99});  // b's one measurement is 1% faster
    for (int k = 0; k < 4; ++k) s.Observe({a, Outcome::kOk, t * (k % 2 ? 1 + noise : 1 - noise)});
  };
  SearchState noisy(cs, SearchSettings::Default(cs));
  const int64_t a = FirstEligible(noisy);
  int64_t b = a + 1;
  while (!noisy.eligible(b)) ++b;
  EXPECT_FALSE(noisy.worth_repeating(a));  // no measurement yet
  measure_all(noisy, a, b, 0.05);
  EXPECT_EQ(noisy.measurements(a), 5);
  EXPECT_EQ(noisy.repeats(), 4);
  EXPECT_EQ(noisy.measured_count(), 2);
  EXPECT_NEAR(noisy.measured_time_s(a), cs.nominal_time_s(a), 1e-9 * cs.nominal_time_s(a));
  EXPECT_NEAR(noisy.measurement_noise_sd(), 0.05, 0.015);
  // Both are contenders at 5% noise; each is worth measuring again.
  EXPECT_EQ(noisy.contenders().size(), 2u);
  EXPECT_TRUE(noisy.worth_repeating(a));
  EXPECT_TRUE(noisy.worth_repeating(b));
  // b's estimate is less sure than a's, which is the mean of five.
  EXPECT_GT(noisy.Estimated(b).sd_s / cs.nominal_time_s(b),
            noisy.Estimated(a).sd_s / cs.nominal_time_s(a));

  SearchState exact(cs, SearchSettings::Default(cs));
  measure_all(exact, a, b, 0.0);
  EXPECT_LT(exact.measurement_noise_sd(), 0.003);
  EXPECT_FALSE(exact.worth_repeating(a));
  EXPECT_FALSE(exact.worth_repeating(b));
  // Without noise, the fastest measurement is the recommendation.
  EXPECT_EQ(exact.best(), b);
  EXPECT_NEAR(exact.best_time_s(), 0.99 * cs.nominal_time_s(a), 0.003 * cs.nominal_time_s(a));
}

// Every third trial from check_from on is a check trial; the errors of those that measured a
// configuration the first time are kept apart for the stop rule (a repeat has no error).
TEST(SearchState, CheckTrialsKeepTheirErrors) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchSettings settings = SearchSettings::Default(cs);
  ASSERT_EQ(settings.check_from, 5);
  ASSERT_EQ(settings.check_every, 3);
  SearchState s(cs, settings);
  std::vector<int64_t> checks;
  for (int64_t t = 0; t < 20; ++t) {
    if (s.IsCheckTrial(t)) checks.push_back(t);
  }
  EXPECT_EQ(checks, (std::vector<int64_t>{7, 10, 13, 16, 19}));
  int64_t next = 0;
  for (int64_t t = 0; t < 14; ++t) {
    if (t == 10) {  // a repeat at a check trial: no error
      s.Observe({s.best(), Outcome::kOk, s.measured_time_s(s.best())});
      continue;
    }
    while (!s.eligible(next)) ++next;
    s.Observe({next, Outcome::kOk, (t == 7 ? 1.3 : 1.0) * cs.nominal_time_s(next)});
  }
  ASSERT_EQ(s.time_errors().size(), 13u);
  ASSERT_EQ(s.check_errors().size(), 2u);  // trials 7 and 13
  EXPECT_EQ(s.check_errors()[0], s.time_errors()[7]);
  EXPECT_EQ(s.check_errors()[1], s.time_errors()[12]);
  EXPECT_GT(s.check_errors()[0], 2);  // 30% slower than the model said
  settings.check_every = 0;
  SearchState none(cs, settings);
  EXPECT_FALSE(none.IsCheckTrial(7));
}

// Checks come every third trial until two agree with the posterior (errors within its intervals),
// then every sixth; a check that misses brings them back to every third for as long as it is
// among the last five.
TEST(SearchState, CheckTrialsSpaceOutWhileTheyAgree) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  ASSERT_EQ(s.settings().check_every_agreeing, 6);
  std::vector<int64_t> checks;
  int64_t next = 0;
  for (int64_t t = 0; t < 30; ++t) {
    const bool check = s.IsCheckTrial(t);
    ASSERT_EQ(check, s.IsCheckTrial(s.trials()));
    if (check) checks.push_back(t);
    while (!s.eligible(next)) ++next;
    // The model exact, but the check at trial 16 30% slower than it says.
    s.Observe({next, Outcome::kOk, (t == 16 ? 1.3 : 1.0) * cs.nominal_time_s(next)});
  }
  // The miss holds the gap at three while it is among the last five checks (16 to 28).
  EXPECT_EQ(checks, (std::vector<int64_t>{7, 10, 16, 19, 22, 25, 28}));
  ASSERT_EQ(s.check_errors().size(), 7u);
  EXPECT_GT(s.check_errors()[2], 2);
  // The past as it was; the future at the present gap.
  EXPECT_TRUE(s.IsCheckTrial(16));
  EXPECT_FALSE(s.IsCheckTrial(13));
  EXPECT_FALSE(s.ChecksAgree());
  EXPECT_TRUE(s.IsCheckTrial(31));
  EXPECT_FALSE(s.IsCheckTrial(33));
  EXPECT_TRUE(s.IsCheckTrial(34));
}

TEST(SearchState, BadMeasurementsAreRejectedLoudly) {
  Llama7bCase c;
  const CandidateSet& cs = *c.candidates;
  SearchState s(cs, SearchSettings::Default(cs));
  const int64_t i = FirstEligible(s);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(s.Observe({i, Outcome::kOk, nan}), std::invalid_argument);
  EXPECT_THROW(s.Observe({i, Outcome::kOk, inf}), std::invalid_argument);
  EXPECT_THROW(s.Observe({i, Outcome::kOk, -1.0}), std::invalid_argument);
  EXPECT_THROW(s.Observe({i, Outcome::kOk, 1.0, inf}), std::invalid_argument);
  EXPECT_THROW(s.Observe({cs.size(), Outcome::kOk, 1.0}), std::invalid_argument);
  EXPECT_EQ(s.trials(), 0);
  for (int k = 0; k < s.settings().max_measurements; ++k) s.Observe({i, Outcome::kOk, 1.0});
  EXPECT_THROW(s.Observe({i, Outcome::kOk, 1.0}), std::invalid_argument);  // once too often
  EXPECT_EQ(ParseOutcome("comm_error"), Outcome::kCommError);
  EXPECT_EQ(ParseOutcome("bogus"), std::nullopt);
}

}  // namespace
}  // namespace autopar::search
