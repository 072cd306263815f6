// The benchmark worlds (include/autopar/coord/worlds.h): each family departs from the scaled
// truth in its own structured way, and a world is a pure function of (family, seed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "autopar/common/errors.h"
#include "autopar/coord/worlds.h"
#include "search_test_util.h"

namespace autopar::coord {
namespace {

using autopar::testing::Llama7bCase;

constexpr WorldFamily kFamilies[] = {
    WorldFamily::kScaled, WorldFamily::kInteractions, WorldFamily::kKernel, WorldFamily::kMemory,
    WorldFamily::kNoisy,  WorldFamily::kNearMemory,   WorldFamily::kMixed};

// A truth without the scaled part's per-configuration noise and surprises, so that a world
// divided by the scaled table of the same seed is exactly the family's structure.
SyntheticTruth Exact(uint64_t seed) {
  SyntheticTruth t;
  t.seed = seed;
  t.noise = 0;
  t.memory_noise = 0;
  t.surprise_oom = 0;
  return t;
}

struct Case {
  Llama7bCase c;
  WorldShape shape = WorldShape::Of(c.model, c.train);
  ReplayTable World(WorldFamily family, const SyntheticTruth& truth,
                    std::string* summary = nullptr) {
    return MakeWorldTable(*c.candidates, shape, family, truth, summary);
  }
};

// step time of the world ÷ step time of the scaled truth, per row (NaN where either is not ok).
std::vector<double> RatioToScaled(const ReplayTable& world, const ReplayTable& scaled) {
  std::vector<double> out;
  for (size_t i = 0; i < world.rows().size(); ++i) {
    const ReplayRow& w = world.rows()[i];
    const ReplayRow& s = scaled.rows()[i];
    const bool ok = w.status == search::Outcome::kOk && s.status == search::Outcome::kOk;
    out.push_back(ok ? w.step_time_s / s.step_time_s : NAN);
  }
  return out;
}

TEST(Worlds, NamesParseAndBadNamesAreRefused) {
  for (const WorldFamily f : kFamilies) EXPECT_EQ(ParseWorldFamily(ToString(f)), f);
  EXPECT_FALSE(ParseWorldFamily("Scaled"));
  EXPECT_FALSE(ParseWorldFamily(""));
  EXPECT_NE(std::string(WorldFamilyNames()).find("near_memory"), std::string::npos);
}

TEST(Worlds, ScaledIsTheSyntheticTable) {
  Case k;
  SyntheticTruth truth;
  truth.seed = 9;
  EXPECT_EQ(k.World(WorldFamily::kScaled, truth).ToCsv(),
            MakeSyntheticTable(*k.c.candidates, truth).ToCsv());
}

TEST(Worlds, AreAPureFunctionOfFamilyAndSeed) {
  Case k;
  SyntheticTruth truth;
  truth.seed = 101;
  std::map<std::string, WorldFamily> seen;
  for (const WorldFamily f : kFamilies) {
    const std::string csv = k.World(f, truth).ToCsv();
    EXPECT_EQ(csv, k.World(f, truth).ToCsv()) << ToString(f);
    SyntheticTruth other = truth;
    other.seed = 102;
    EXPECT_NE(csv, k.World(f, other).ToCsv()) << ToString(f);
    const auto [it, fresh] = seen.emplace(csv, f);
    EXPECT_TRUE(fresh) << ToString(f) << " is the same table as " << ToString(it->second);
  }
}

// A row's draws follow its configuration, not its place in the set: the table of a smaller set in
// the opposite order has the same step time, peak and status for every row it shares (families
// without a set-wide normalisation: kernel's median and near_memory's scale depend on the set).
TEST(Worlds, ARowsDrawsDoNotDependOnTheOtherRows) {
  Case k;
  std::vector<ParallelConfig> fewer;
  for (int64_t i = k.c.candidates->size() - 1; i >= 0; i -= 3) {
    fewer.push_back(k.c.candidates->config(i));
  }
  const search::CandidateSet subset(fewer, *k.c.cost, k.c.candidates->capacity_gib());
  SyntheticTruth truth;
  truth.seed = 7;
  truth.surprise_oom = 0.2;  // oom rows among those compared
  for (const WorldFamily f : {WorldFamily::kScaled, WorldFamily::kInteractions,
                              WorldFamily::kMemory, WorldFamily::kNoisy}) {
    const ReplayTable all = k.World(f, truth);
    const ReplayTable part = MakeWorldTable(subset, k.shape, f, truth);
    std::map<std::string, const ReplayRow*> by_spec;
    for (const ReplayRow& r : all.rows()) by_spec[ToSpec(r.config)] = &r;
    int64_t ooms = 0;
    for (const ReplayRow& r : part.rows()) {
      const ReplayRow& same = *by_spec.at(ToSpec(r.config));
      EXPECT_EQ(r.status, same.status) << ToString(f) << " " << ToSpec(r.config);
      EXPECT_EQ(r.peak_memory_gib, same.peak_memory_gib) << ToString(f) << " " << ToSpec(r.config);
      if (r.status == search::Outcome::kOom) {
        ++ooms;
        continue;
      }
      EXPECT_EQ(r.step_time_s, same.step_time_s) << ToString(f) << " " << ToSpec(r.config);
      EXPECT_EQ(r.noise_sd, same.noise_sd) << ToString(f) << " " << ToSpec(r.config);
    }
    EXPECT_GT(ooms, 0) << ToString(f);
  }
}

// The ratio to the scaled truth at (tp=2, pp=2) is not the product of the (tp=2, pp=1) and
// (tp=1, pp=2) ratios (over (1, 1)): a tp×pp interaction, which per-knob level effects cannot
// express. In the scaled world itself the ratio is 1 everywhere.
TEST(Worlds, InteractionsAreNotAProductOfPerKnobEffects) {
  Case k;
  const SyntheticTruth truth = Exact(101);
  const ReplayTable scaled = k.World(WorldFamily::kScaled, truth);
  const std::vector<double> ratio =
      RatioToScaled(k.World(WorldFamily::kInteractions, truth), scaled);
  // Rows keyed by every knob but tp, pp (and the derived dp).
  std::map<std::string, std::map<std::pair<int, int>, double>> groups;
  for (size_t i = 0; i < ratio.size(); ++i) {
    if (std::isnan(ratio[i])) continue;
    ParallelConfig c = scaled.rows()[i].config;
    const std::pair<int, int> tp_pp = {c.tp, c.pp};
    c.tp = c.pp = c.dp = 1;
    groups[ToSpec(c)][tp_pp] = ratio[i];
  }
  int quartets = 0, interacting = 0;
  for (const auto& [key, g] : groups) {
    if (!g.count({1, 1}) || !g.count({2, 1}) || !g.count({1, 2}) || !g.count({2, 2})) continue;
    ++quartets;
    const double double_ratio = g.at({2, 2}) * g.at({1, 1}) / (g.at({2, 1}) * g.at({1, 2}));
    if (std::fabs(std::log(double_ratio)) > 0.01) ++interacting;
  }
  ASSERT_GT(quartets, 0);
  EXPECT_EQ(interacting, quartets);
  // Factors of 5-10% per pair: the world moves configurations by several percent.
  double lo = INFINITY, hi = 0;
  for (const double r : ratio) {
    if (!std::isnan(r)) lo = std::min(lo, r), hi = std::max(hi, r);
  }
  EXPECT_GT(hi / lo, 1.15);
  for (const double r : RatioToScaled(scaled, scaled)) {
    if (!std::isnan(r)) {
      EXPECT_EQ(r, 1.0);
    }
  }
}

// Compute slows or speeds up with the GEMM shape and one bad value of tp or mbs; memory and the
// set of OOM rows stay those of the scaled truth.
TEST(Worlds, KernelEfficiencyFollowsTheShape) {
  Case k;
  const SyntheticTruth truth = Exact(101);
  std::string summary;
  const ReplayTable scaled = k.World(WorldFamily::kScaled, truth);
  const ReplayTable kernel = k.World(WorldFamily::kKernel, truth, &summary);
  EXPECT_NE(summary.find("bad shape"), std::string::npos) << summary;
  const std::vector<double> ratio = RatioToScaled(kernel, scaled);
  // Configurations that differ only in mbs (the GEMM's M) change by different factors.
  std::map<std::string, std::map<int, double>> by_mbs;
  for (size_t i = 0; i < ratio.size(); ++i) {
    EXPECT_EQ(kernel.rows()[i].status, scaled.rows()[i].status);
    EXPECT_EQ(kernel.rows()[i].peak_memory_gib, scaled.rows()[i].peak_memory_gib);
    if (std::isnan(ratio[i])) continue;
    ParallelConfig c = scaled.rows()[i].config;
    const int mbs = c.mbs;
    c.mbs = 1;
    by_mbs[ToSpec(c)][mbs] = ratio[i];
  }
  int shape_dependent = 0;
  for (const auto& [key, g] : by_mbs) {
    if (g.size() >= 2 && std::fabs(g.rbegin()->second / g.begin()->second - 1) > 0.02) {
      ++shape_dependent;
    }
  }
  EXPECT_GT(shape_dependent, 10);
}

TEST(Worlds, MemoryRunsOutWhereTheModelSaysItFits) {
  Case k;
  const SyntheticTruth truth = Exact(101);
  const ReplayTable memory = k.World(WorldFamily::kMemory, truth);
  const search::CandidateSet& cs = *k.c.candidates;
  int surprising = 0;
  for (size_t i = 0; i < memory.rows().size(); ++i) {
    const ReplayRow& r = memory.rows()[i];
    const double modelled = cs.nominal_memory_gib(static_cast<int64_t>(i));
    EXPECT_GE(r.peak_memory_gib, 1.05 * modelled + 0.5);  // scale ≥ 1.05, per-tp term ≥ 0.5 GiB
    if (r.status == search::Outcome::kOom && modelled <= cs.capacity_gib()) ++surprising;
  }
  EXPECT_GT(surprising, 10);
}

TEST(Worlds, NearMemoryPutsTheBestFitNearTheLimit) {
  Case k;
  for (const uint64_t seed : {1, 2, 101, 102}) {
    SyntheticTruth truth;
    truth.seed = seed;
    const ReplayTable near = k.World(WorldFamily::kNearMemory, truth);
    const ReplayRow* best = near.Best();
    ASSERT_NE(best, nullptr);
    const double fraction = best->peak_memory_gib / k.c.candidates->capacity_gib();
    EXPECT_GE(fraction, 0.90) << seed;
    EXPECT_LE(fraction, 0.99 + 1e-9) << seed;
    // The scaled truth's best of the same seed is not that close to the limit.
    const ReplayTable scaled = k.World(WorldFamily::kScaled, truth);  // Best() points into it
    const ReplayRow* plain = scaled.Best();
    EXPECT_LT(plain->peak_memory_gib, best->peak_memory_gib) << seed;
  }
}

// The table keeps the noise-free step time; the replay backend draws each measurement around it,
// a pure function of (study seed, spec, attempt).
TEST(Worlds, NoisyMeasurementsAreDrawnByTheBackend) {
  Case k;
  SyntheticTruth truth;
  truth.seed = 101;
  const ReplayTable noisy = k.World(WorldFamily::kNoisy, truth);
  const ReplayTable scaled = k.World(WorldFamily::kScaled, truth);
  const std::string csv = noisy.ToCsv();
  EXPECT_NE(csv.substr(0, csv.find('\n')).find(",noise_sd"), std::string::npos);
  EXPECT_EQ(scaled.ToCsv().find("noise_sd"), std::string::npos);
  const ReplayTable parsed = ReplayTable::Parse(csv, "noisy.csv");
  ReplayBackend backend(parsed, 7), same(parsed, 7), other_seed(parsed, 8);
  double sum_sq = 0;
  int n = 0;
  for (size_t i = 0; i < noisy.rows().size(); ++i) {
    const ReplayRow& r = parsed.rows()[i];
    EXPECT_EQ(r.status, scaled.rows()[i].status);
    if (r.status != search::Outcome::kOk) continue;
    // The mean is the scaled truth (to the CSV's nine digits).
    EXPECT_NEAR(r.step_time_s, scaled.rows()[i].step_time_s, 1e-8 * r.step_time_s);
    EXPECT_GE(r.noise_sd, 0.02);
    EXPECT_LE(r.noise_sd, 0.05);
    pb::TrialRequest q;
    q.set_spec(ToSpec(r.config));
    q.set_attempt(1);
    const double measured = backend.Run(q).step_time_s();
    EXPECT_EQ(measured, same.Run(q).step_time_s());
    EXPECT_NE(measured, other_seed.Run(q).step_time_s());
    q.set_attempt(2);
    EXPECT_NE(measured, backend.Run(q).step_time_s());
    const double z = std::log(measured / r.step_time_s) / r.noise_sd;
    sum_sq += z * z;
    ++n;
  }
  ASSERT_GT(n, 100);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 1.0, 0.15);
  // A table without the column is measured exactly.
  ReplayBackend exact(scaled, 7);
  const ReplayRow* best = scaled.Best();
  pb::TrialRequest q;
  q.set_spec(ToSpec(best->config));
  EXPECT_EQ(exact.Run(q).step_time_s(), best->step_time_s);
}

TEST(Worlds, NoiseColumnIsCheckedWhenPresent) {
  const std::string header =
      "tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,dist_opt,step_time_s,peak_memory_gib,status,"
      "noise_sd\n";
  const ReplayTable t = ReplayTable::Parse(
      header +
          "2,1,4,1,1,1,1,1,on,none,off,1.5,30,ok,0.03\n1,1,8,1,1,1,1,1,off,none,off,2,30,ok,\n",
      "t.csv");
  EXPECT_EQ(t.rows()[0].noise_sd, 0.03);
  EXPECT_EQ(t.rows()[1].noise_sd, 0);
  try {
    ReplayTable::Parse(header + "2,1,4,1,1,1,1,1,on,none,off,1.5,30,ok,-0.1\n", "t.csv");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("noise_sd"), std::string::npos) << e.what();
  }
}

// mixed holds the very components of interactions, kernel, memory and noisy of the same seed.
TEST(Worlds, MixedCombinesTheComponents) {
  Case k;
  const SyntheticTruth truth = Exact(103);
  const ReplayTable mixed = k.World(WorldFamily::kMixed, truth);
  const ReplayTable memory = k.World(WorldFamily::kMemory, truth);
  const ReplayTable noisy = k.World(WorldFamily::kNoisy, truth);
  const ReplayTable scaled = k.World(WorldFamily::kScaled, truth);
  const std::vector<double> interactions =
      RatioToScaled(k.World(WorldFamily::kInteractions, truth), scaled);
  const std::vector<double> kernel = RatioToScaled(k.World(WorldFamily::kKernel, truth), scaled);
  const std::vector<double> both = RatioToScaled(mixed, scaled);
  for (size_t i = 0; i < mixed.rows().size(); ++i) {
    EXPECT_EQ(mixed.rows()[i].peak_memory_gib, memory.rows()[i].peak_memory_gib);
    EXPECT_EQ(mixed.rows()[i].status, memory.rows()[i].status);
    if (std::isnan(both[i])) continue;
    EXPECT_EQ(mixed.rows()[i].noise_sd, noisy.rows()[i].noise_sd);
    EXPECT_NEAR(both[i], interactions[i] * kernel[i], 1e-9 * both[i]);
  }
}

}  // namespace
}  // namespace autopar::coord
