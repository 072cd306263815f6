#include <gtest/gtest.h>

#include <cmath>

#include "autopar/common/errors.h"
#include "autopar/coord/replay.h"
#include "search_test_util.h"

namespace autopar::coord {
namespace {

using autopar::testing::Llama7bCase;

constexpr const char* kHeader =
    "tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,dist_opt,step_time_s,peak_memory_gib,status\n";

void ExpectBad(const std::string& text, const std::string& must_mention) {
  try {
    ReplayTable::Parse(text, "t.csv");
    FAIL() << "accepted: " << text;
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--replay-table");
    EXPECT_NE(std::string(e.what()).find(must_mention), std::string::npos) << e.what();
  }
}

TEST(ReplayTable, ParsesColumnsInAnyOrderWithExtras) {
  const ReplayTable t = ReplayTable::Parse(
      "# a comment\n"
      "status,tp,pp,dp,cp,up,ep,vpp,mbs,sp,recompute,dist_opt,step_time_s,peak_memory_gib,note,"
      "recompute_layers\n"
      "ok,2,1,8,1,1,1,1,1,on,selective,off,1.5,40.25,fast,0\n"
      "\n"
      "oom,1,1,16,1,1,1,1,4,off,full,true,,90,,2\n",
      "t.csv");
  ASSERT_EQ(t.rows().size(), 2u);
  EXPECT_EQ(ToSpec(t.rows()[0].config),
            "tp=2,pp=1,dp=8,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=on,recompute=selective,dist_opt=off");
  EXPECT_EQ(t.rows()[1].config.recompute_layers, 2);
  EXPECT_EQ(t.rows()[1].status, search::Outcome::kOom);
  EXPECT_TRUE(std::isnan(t.rows()[1].step_time_s));
  EXPECT_EQ(t.Best(), &t.rows()[0]);
  // Canonical CSV round-trips.
  const ReplayTable again = ReplayTable::Parse(t.ToCsv(), "again.csv");
  ASSERT_EQ(again.rows().size(), 2u);
  EXPECT_EQ(again.rows()[1].config, t.rows()[1].config);
  EXPECT_EQ(again.rows()[0].step_time_s, 1.5);
}

TEST(ReplayTable, ReadsAnEtpColumnAndWritesOneOnlyWhereARowNeedsIt) {
  const ReplayTable t = ReplayTable::Parse(std::string("etp,") + kHeader +
                                               "1,2,1,8,1,1,4,1,1,on,none,off,1.5,40,ok\n"
                                               "2,2,1,8,1,1,2,1,1,on,none,off,1.7,40,ok\n",
                                           "t.csv");
  ASSERT_EQ(t.rows().size(), 2u);
  EXPECT_EQ(t.rows()[0].config.etp, 1);
  EXPECT_EQ(t.rows()[1].config.etp, 0);  // etp = tp: the canonical 0
  EXPECT_NE(t.ToCsv().find(",etp\n"), std::string::npos) << t.ToCsv();
  const ReplayTable again = ReplayTable::Parse(t.ToCsv(), "again.csv");
  EXPECT_EQ(again.rows()[0].config, t.rows()[0].config);
  EXPECT_EQ(again.rows()[1].config, t.rows()[1].config);
  // A table whose experts all follow tp reads and writes as it did before etp existed.
  const ReplayTable plain = ReplayTable::Parse(
      std::string(kHeader) + "2,1,8,1,1,2,1,1,on,none,off,1.7,40,ok\n", "t.csv");
  EXPECT_EQ(plain.ToCsv().find("etp"), std::string::npos);
}

TEST(ReplayTable, ReadsARecomputeModulesColumnAndWritesOneOnlyWhereARowNeedsIt) {
  const ReplayTable t =
      ReplayTable::Parse(std::string("recompute_modules,") + kHeader +
                             "layernorm+moe,2,1,8,1,1,4,1,1,on,selective,off,1.5,40,ok\n"
                             ",2,1,8,1,1,4,1,1,on,selective,off,1.6,41,ok\n"
                             "core_attn,2,1,8,1,1,4,1,2,on,selective,off,1.7,42,ok\n",
                         "t.csv");
  ASSERT_EQ(t.rows().size(), 3u);
  EXPECT_EQ(t.rows()[0].config.selective_modules(), kRecomputeLayernorm | kRecomputeMoe);
  EXPECT_EQ(t.rows()[1].config.recompute_modules, 0);
  EXPECT_EQ(t.rows()[2].config.recompute_modules, 0);  // core_attn alone: the canonical 0
  const ReplayTable again = ReplayTable::Parse(t.ToCsv(), "again.csv");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.rows()[i].config, t.rows()[i].config) << i;
  EXPECT_NE(t.ToCsv().find(",recompute_modules\n"), std::string::npos) << t.ToCsv();
  EXPECT_EQ(ReplayTable::Parse(std::string(kHeader) + "2,1,8,1,1,4,1,1,on,selective,off,1,1,ok\n",
                               "t.csv")
                .ToCsv()
                .find("recompute_modules"),
            std::string::npos);
  ExpectBad(
      std::string("recompute_modules,") + kHeader + "moe,2,1,8,1,1,4,1,1,on,none,off,1.5,40,ok\n",
      "recompute_modules");
}

// A switch column a table may hold: `on` in the first row, empty (the default) in the second,
// `off` spelt out in the third (rows of a layout with tp 2, cp 2, dp 4 over 16 GPUs); written back
// only where some row needs it; `bad` refused with `allowed`.
void ExpectSwitchColumn(const std::string& column, const std::string& on, const std::string& off,
                        bool ParallelConfig::*knob, const std::string& bad,
                        const std::string& allowed) {
  const ReplayTable t = ReplayTable::Parse(column + "," + kHeader + on +
                                               ",2,1,4,2,1,4,1,1,on,none,off,1.5,40,ok\n"
                                               ",2,1,4,2,1,4,1,2,on,none,off,1.6,41,ok\n" +
                                               off + ",2,1,4,2,1,4,2,1,on,none,off,1.7,42,ok\n",
                                           "t.csv");
  ASSERT_EQ(t.rows().size(), 3u);
  EXPECT_TRUE(t.rows()[0].config.*knob);
  EXPECT_FALSE(t.rows()[1].config.*knob);
  EXPECT_FALSE(t.rows()[2].config.*knob);
  const ReplayTable again = ReplayTable::Parse(t.ToCsv(), "again.csv");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.rows()[i].config, t.rows()[i].config) << i;
  EXPECT_NE(t.ToCsv().find("," + column + "\n"), std::string::npos) << t.ToCsv();
  EXPECT_EQ(
      ReplayTable::Parse(std::string(kHeader) + "2,1,8,1,1,4,1,1,on,none,off,1,1,ok\n", "t.csv")
          .ToCsv()
          .find(column),
      std::string::npos);
  ExpectBad(column + "," + kHeader + bad + ",2,1,4,2,1,4,1,1,on,none,off,1.5,40,ok\n", allowed);
}

TEST(ReplayTable, ReadsADispatcherColumnAndWritesOneOnlyWhereARowNeedsIt) {
  ExpectSwitchColumn("dispatcher", "flex", "alltoall", &ParallelConfig::flex_dispatcher, "deepep",
                     "allowed: alltoall, flex");
}

TEST(ReplayTable, ReadsACpCommColumnAndWritesOneOnlyWhereARowNeedsIt) {
  ExpectSwitchColumn("cp_comm", "allgather", "p2p", &ParallelConfig::cp_allgather, "a2a",
                     "allowed: p2p, allgather");
}

TEST(ReplayTable, ReadsAnFp8ParamGatherColumnAndWritesOneOnlyWhereARowNeedsIt) {
  ExpectSwitchColumn("fp8_param_gather", "on", "off", &ParallelConfig::fp8_param_gather, "maybe",
                     "allowed: on, off");
}

TEST(ReplayTable, ReadsTheCountedSplitColumnsAndWritesThemOnlyWhereARowNeedsThem) {
  const ReplayTable t = ReplayTable::Parse(std::string("split_embedding,split_loss,") + kHeader +
                                               "on,on,2,2,4,1,1,1,2,1,on,none,off,1.5,40,ok\n"
                                               "on,off,2,2,4,1,1,1,2,2,on,none,off,1.6,41,ok\n"
                                               "off,off,2,2,4,1,1,1,1,1,on,none,off,1.7,42,ok\n",
                                           "t.csv");
  ASSERT_EQ(t.rows().size(), 3u);
  EXPECT_TRUE(t.rows()[0].config.split_embedding && t.rows()[0].config.split_loss);
  EXPECT_TRUE(t.rows()[1].config.split_embedding && !t.rows()[1].config.split_loss);
  EXPECT_FALSE(t.rows()[2].config.split_embedding || t.rows()[2].config.split_loss);
  EXPECT_NE(t.ToCsv().find(",split_embedding,split_loss\n"), std::string::npos) << t.ToCsv();
  const ReplayTable again = ReplayTable::Parse(t.ToCsv(), "again.csv");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.rows()[i].config, t.rows()[i].config) << i;
  EXPECT_EQ(
      ReplayTable::Parse(std::string(kHeader) + "2,1,8,1,1,4,1,1,on,none,off,1,1,ok\n", "t.csv")
          .ToCsv()
          .find("split_"),
      std::string::npos);
  ExpectBad(std::string("split_loss,") + kHeader + "yes,2,2,4,1,1,1,2,1,on,none,off,1.5,40,ok\n",
            "split_loss");
}

TEST(ReplayTable, BadInputNamesLineColumnAndAllowedValues) {
  ExpectBad("tp,pp\n1,1\n", "'dp'");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,maybe,none,off,1,1,ok\n", "on, off");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,on,some,off,1,1,ok\n", "none, selective");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,on,none,off,1,1,fine\n", "comm_error");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,on,none,off,,1,ok\n", "t.csv:2");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,on,none,off,inf,1,ok\n", "step_time_s");
  ExpectBad(std::string(kHeader) + "1,1,8,1,1,1,1,1,on,none,off,1,1,ok\n" +
                "1,1,8,1,1,1,1,1,on,none,off,2,1,ok\n",
            "appears twice");
  ExpectBad(kHeader, "no rows");
  // A header that repeats a name (the fuzzer's out-of-bounds read) is refused outright.
  std::string repeated = "tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,tp,";
  repeated += kHeader;
  ExpectBad(repeated + "1,1,8,1,1,1,1,1,on,none,off,1,1,ok\n", "names 'tp' twice");
}

// Issue 17: a header naming a column twice read cells past the end of a shorter row; absurd or
// non-finite measurements reached the posterior (1e308 s overflowed it).
TEST(ReplayTable, RefusesARepeatedColumnAndMeasurementsPastTheBounds) {
  std::string wide;
  for (int i = 0; i < 2000; ++i) wide += "tp,";
  ExpectBad(wide + kHeader + "1,1,8,1,1,1,1,1,on,none,off,1,1,ok\n", "names 'tp' twice");
  ExpectBad(std::string("x,") + kHeader + "1,1,8,1,1,1,1,1,on,none,off,1,1,ok\n",
            "t.csv:2: column *: expected 15 cells, got 14");
  const std::string row = "1,1,8,1,1,1,1,1,on,none,off,";
  for (const char* bad : {"1e308", "inf", "-inf", "nan", "NaN", "1e-300", "2e6", "0x"}) {
    ExpectBad(std::string(kHeader) + row + bad + ",1,ok\n", "t.csv:2: column step_time_s");
    ExpectBad(std::string(kHeader) + row + "1," + bad + ",ok\n", "t.csv:2: column peak_memory_gib");
  }
  // Within the bounds, and empty where not measured, still reads.
  const ReplayTable t = ReplayTable::Parse(
      std::string(kHeader) + row + "1e6,1e6,ok\n" + "1,1,8,1,1,1,1,2,on,none,off,,,oom\n", "t.csv");
  EXPECT_EQ(t.rows()[0].step_time_s, kMaxStepTimeS);
  EXPECT_TRUE(std::isnan(t.rows()[1].peak_memory_gib));
}

TEST(ReplayTable, RowsMustBeValidForTheModelAndCluster) {
  Llama7bCase c(1);
  SpaceOptions open;
  open.tp_across_nodes = true;
  const SearchSpace space(c.model, c.train, c.cluster, open);
  ReplayTable::Parse(std::string(kHeader) + "2,1,4,1,1,1,1,1,on,none,off,1,1,ok\n", "t.csv")
      .Validate(space, "t.csv");
  try {
    ReplayTable::Parse(std::string(kHeader) + "3,1,2,1,1,1,1,1,on,none,off,1,1,ok\n", "t.csv")
        .Validate(space, "t.csv");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:2"), std::string::npos) << e.what();
  }
}

TEST(ReplayBackend, AnswersFromTheTable) {
  const ReplayTable t =
      ReplayTable::Parse(std::string(kHeader) + "2,1,4,1,1,1,1,1,on,none,off,1.25,30,ok\n" +
                             "1,1,8,1,1,1,1,2,off,none,off,,85,oom\n",
                         "t.csv");
  ReplayBackend backend(t);
  pb::TrialRequest q;
  q.set_trial_index(3);
  q.set_spec(ToSpec(t.rows()[0].config));
  pb::TrialResult r = backend.Run(q);
  EXPECT_EQ(r.status(), pb::OK);
  EXPECT_EQ(r.step_time_s(), 1.25);
  EXPECT_EQ(r.peak_memory_gib(), 30);
  EXPECT_EQ(r.trial_index(), 3);
  q.set_spec(ToSpec(t.rows()[1].config));
  EXPECT_EQ(backend.Run(q).status(), pb::OOM);
  q.set_spec("tp=64");
  EXPECT_EQ(backend.Run(q).status(), pb::INVALID);
}

TEST(SyntheticTable, IsAPureFunctionOfItsSeedAndMisSpecifiesTheModel) {
  Llama7bCase c;
  SyntheticTruth truth;
  truth.seed = 4;
  const ReplayTable a = MakeSyntheticTable(*c.candidates, truth);
  const ReplayTable b = MakeSyntheticTable(*c.candidates, truth);
  EXPECT_EQ(a.ToCsv(), b.ToCsv());
  truth.seed = 5;
  EXPECT_NE(a.ToCsv(), MakeSyntheticTable(*c.candidates, truth).ToCsv());
  ASSERT_EQ(static_cast<int64_t>(a.rows().size()), c.candidates->size());
  int ok = 0, oom = 0, off_by_5pct = 0;
  for (size_t i = 0; i < a.rows().size(); ++i) {
    const ReplayRow& r = a.rows()[i];
    if (r.status == search::Outcome::kOom) ++oom;
    if (r.status != search::Outcome::kOk) continue;
    ++ok;
    const double ratio = r.step_time_s / c.candidates->nominal_time_s(static_cast<int64_t>(i));
    if (std::fabs(ratio - 1) > 0.05) ++off_by_5pct;
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(oom, 0);
  EXPECT_GT(off_by_5pct, ok / 10);  // the truth is not the analytic model
}

}  // namespace
}  // namespace autopar::coord
