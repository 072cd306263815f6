#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "autopar/coord/convert.h"
#include "autopar/coord/files.h"
#include "autopar/coord/replay.h"
#include "autopar/coord/tuner.h"
#include "search_test_util.h"

namespace autopar::coord {
namespace {

using autopar::testing::Llama7bCase;

struct Fixture {
  Llama7bCase c;
  ReplayTable table;
  search::ThompsonSearcher searcher;
  TunerOptions options;
  Fixture() : table(MakeSyntheticTable(*c.candidates, SyntheticTruth{})) { options.seed = 17; }
  search::SearchSettings Settings() const { return search::SearchSettings::Default(*c.candidates); }
};

// The specs proposed, in order, by the trials of a tuner.
std::vector<std::string> Specs(const Tuner& t) {
  std::vector<std::string> out;
  for (const TrialRecord& r : t.trials())
    out.push_back(r.result.spec() + "/" + StatusName(r.result.status()));
  return out;
}

TEST(Tuner, RunsToAStopRuleAndFindsAGoodConfiguration) {
  Fixture f;
  MemoryJournal journal;
  ReplayBackend backend(f.table);
  Tuner tuner(*f.c.candidates, f.searcher, f.Settings(), f.options, journal, backend);
  const TuneSummary s = tuner.Run();
  EXPECT_NE(s.stop.reason, search::StopReason::kNone);
  ASSERT_GE(tuner.state().best(), 0);
  const double best = f.table.Best()->step_time_s;
  EXPECT_LE(tuner.state().best_time_s(), 1.05 * best);
  EXPECT_LT(tuner.state().trials(), f.c.candidates->size() / 4);
  EXPECT_EQ(journal.all().back().kind_case(), pb::JournalRecord::kFinished);
}

// Resume from every prefix of an uninterrupted journal (a crash after any record) and run to the
// end: the proposals, the results and the final state are those of the uninterrupted run.
TEST(Tuner, ResumingFromAnyRecordReproducesTheUninterruptedRun) {
  Fixture f;
  MemoryJournal full;
  ReplayBackend backend(f.table);
  Tuner reference(*f.c.candidates, f.searcher, f.Settings(), f.options, full, backend);
  reference.Run();
  const uint64_t final_digest = reference.state().Digest();
  const size_t n = full.all().size();
  for (size_t cut = 0; cut < n; cut += (cut < 12 ? 1 : 5)) {
    const std::vector<pb::JournalRecord> prefix(full.all().begin(), full.all().begin() + cut);
    MemoryJournal journal;
    for (const auto& r : prefix) journal.Append(r);
    Tuner resumed(*f.c.candidates, f.searcher, f.Settings(), f.options, journal, backend);
    resumed.Replay(prefix);
    resumed.Run();
    EXPECT_EQ(Specs(resumed), Specs(reference)) << "cut after record " << cut;
    EXPECT_EQ(resumed.state().Digest(), final_digest) << "cut after record " << cut;
  }
}

TEST(Tuner, ReplayedStateProposesTheSameNext) {
  Fixture f;
  MemoryJournal journal;
  ReplayBackend backend(f.table);
  TunerOptions few = f.options;
  few.stop.max_trials = 6;
  Tuner live(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  live.Run();
  Tuner replayed(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  replayed.Replay(journal.all());
  EXPECT_EQ(replayed.state().Digest(), live.state().Digest());
  EXPECT_EQ(replayed.state().time().mean(), live.state().time().mean());
  EXPECT_EQ(f.searcher.Propose(replayed.state(), 17, 6), f.searcher.Propose(live.state(), 17, 6));
}

// A configuration survives its message: every field, the expert tensor parallel size included;
// a message without etp (an older journal's) means experts that follow tp.
TEST(Convert, ParallelConfigRoundTripsThroughItsMessage) {
  for (const char* spec : {"tp=4,pp=2,dp=2,ep=8,etp=1,vpp=2,mbs=2,sp=on,recompute=selective",
                           "tp=2,dp=8,ep=4,sp=on,dist_opt=on,grad_reduce_dtype=bf16",
                           "tp=2,dp=4,cp=2,cp_comm=allgather,dist_opt=on,fp8_param_gather=on",
                           "tp=1,dp=16,ep=2,etp=2,recompute=full,recompute_layers=1",
                           "tp=2,pp=8,vpp=4,split_embedding=on,split_loss=on,sp=on",
                           "tp=2,dp=4,sp=on,recompute=selective,recompute_modules=layernorm+moe"}) {
    const ParallelConfig c = ParseSpec(spec);
    EXPECT_EQ(FromProto(ToProto(c)), c) << spec;
  }
  pb::ParallelConfig old = ToProto(ParseSpec("tp=4,dp=4,ep=4,sp=on"));
  old.clear_etp();
  EXPECT_EQ(FromProto(old).expert_tp(), 4);
  old.set_etp(4);  // written explicitly equal to tp: the same configuration
  EXPECT_EQ(FromProto(old), ParseSpec("tp=4,dp=4,ep=4,sp=on"));
}

// The posterior and the whole state survive serialisation: records framed to a file, read back,
// replayed.
TEST(Tuner, StateRoundTripsThroughTheJournalFile) {
  Fixture f;
  const std::string path = ::testing::TempDir() + "tuner_roundtrip_" + std::to_string(::getpid());
  std::remove(path.c_str());
  ReplayBackend backend(f.table);
  TunerOptions few = f.options;
  few.stop.max_trials = 9;
  few.stop.min_measured = 1000;  // max_trials decides
  uint64_t digest = 0;
  std::vector<double> theta;
  {
    FileJournal::Opened j = FileJournal::Open(path);
    Tuner live(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
    live.Run();
    digest = live.state().Digest();
    theta = live.state().time().mean();
  }
  FileJournal::Opened j = FileJournal::Open(path);
  Tuner replayed(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
  replayed.Replay(j.records);
  EXPECT_EQ(replayed.state().Digest(), digest);
  EXPECT_EQ(replayed.state().time().mean(), theta);  // bit for bit
  EXPECT_EQ(replayed.trials().size(), 9u);
  std::remove(path.c_str());
}

// The probe runs once per study: a resumed study tightens its prior from the journal.
class CountingProbe : public TrialBackend {
 public:
  explicit CountingProbe(TrialBackend& inner) : inner_(inner) {}
  std::string name() const override { return "counting"; }
  pb::ProbeRecorded Probe() override {
    ++probes;
    pb::ProbeRecorded p;
    pb::ProbeRecorded::Feature* f = p.add_features();
    f->set_feature("dp_comm");
    f->add_ratios(0.7);
    f->add_ratios(0.8);
    return p;
  }
  pb::TrialResult Run(const pb::TrialRequest& q) override { return inner_.Run(q); }
  int probes = 0;

 private:
  TrialBackend& inner_;
};

TEST(Tuner, TheProbeRunsOncePerStudy) {
  Fixture f;
  ReplayBackend replay(f.table);
  CountingProbe backend(replay);
  TunerOptions few = f.options;
  few.stop.max_trials = 3;
  few.stop.min_measured = 1000;
  MemoryJournal journal;
  Tuner first(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  first.Run();
  few.stop.max_trials = 6;
  Tuner second(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  second.Replay(std::vector<pb::JournalRecord>(journal.all()));
  EXPECT_EQ(second.state().Digest(), first.state().Digest());
  second.Run();
  EXPECT_EQ(backend.probes, 1);
  EXPECT_EQ(second.trials().size(), 6u);
}

TEST(Tuner, AJournalOfAnotherSeedDoesNotReplay) {
  Fixture f;
  MemoryJournal journal;
  ReplayBackend backend(f.table);
  search::RandomSearcher random;
  TunerOptions few = f.options;
  few.stop.max_trials = 4;
  Tuner live(*f.c.candidates, random, f.Settings(), few, journal, backend);
  live.Run();
  Tuner same(*f.c.candidates, random, f.Settings(), few, journal, backend);
  EXPECT_NO_THROW(same.Replay(journal.all()));
  few.seed = 18;
  Tuner other(*f.c.candidates, random, f.Settings(), few, journal, backend);
  EXPECT_THROW(other.Replay(journal.all()), StudyError);
}

// A study begun by another build (here: one whose check trials fall elsewhere, so it proposes
// otherwise from trial 5 on) does not replay under the checks; ReplayAcrossBuilds replays its
// measurements as observations instead, with the probe's tightening applied once, and the study
// goes on. A journal that replays is replayed as before.
TEST(Tuner, AJournalOfAnotherBuildReplaysItsMeasurementsWithoutTheChecks) {
  Fixture f;
  MemoryJournal journal;
  ReplayBackend replay(f.table);
  CountingProbe backend(replay);  // its probe record tightens the prior on replay
  TunerOptions few = f.options;
  few.stop.max_trials = 12;
  few.stop.min_measured = 1000;  // max_trials decides
  search::SearchSettings earlier = f.Settings();
  earlier.check_every = 4;
  Tuner live(*f.c.candidates, f.searcher, earlier, few, journal, backend);
  live.Run();
  const std::vector<pb::JournalRecord> records = journal.all();

  Tuner strict(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  EXPECT_THROW(strict.Replay(records), StudyError);
  Tuner unchecked(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  unchecked.Replay(records, 0);
  Tuner resumed(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  const std::string why = resumed.ReplayAcrossBuilds(records, records.size());
  EXPECT_NE(why.find("does not replay"), std::string::npos) << why;
  EXPECT_EQ(resumed.state().Digest(), unchecked.state().Digest());
  ASSERT_EQ(resumed.trials().size(), live.trials().size());
  EXPECT_EQ(Specs(resumed), Specs(live));
  few.stop.max_trials = 16;
  Tuner goes_on(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  EXPECT_FALSE(goes_on.ReplayAcrossBuilds(records, records.size()).empty());
  goes_on.Run();
  EXPECT_EQ(goes_on.trials().size(), 16u);

  Tuner same_build(*f.c.candidates, f.searcher, earlier, few, journal, backend);
  EXPECT_EQ(same_build.ReplayAcrossBuilds(records, records.size()), "");
  EXPECT_EQ(same_build.state().Digest(), live.state().Digest());
}

// A backend whose process "dies" inside chosen trials: Run throws, as a killed coordinator would
// stop, leaving the trial started but not finished in the journal.
class DyingBackend : public TrialBackend {
 public:
  DyingBackend(TrialBackend& inner, int deaths) : inner_(inner), deaths_(deaths) {}
  std::string name() const override { return "dying"; }
  pb::ProbeRecorded Probe() override { return inner_.Probe(); }
  pb::TrialResult Run(const pb::TrialRequest& q) override {
    if (q.trial_index() == 2 && deaths_-- > 0) throw std::runtime_error("killed");
    return inner_.Run(q);
  }

 private:
  TrialBackend& inner_;
  int deaths_;
};

TEST(Tuner, TheTrialInFlightIsRetriedTwiceThenWorkerLost) {
  Fixture f;
  ReplayBackend replay(f.table);
  TunerOptions few = f.options;
  few.stop.max_trials = 4;
  MemoryJournal journal;
  DyingBackend dying(replay, /*deaths=*/3);
  for (int session = 0; session < 4; ++session) {
    Tuner t(*f.c.candidates, f.searcher, f.Settings(), few, journal, dying);
    t.Replay(std::vector<pb::JournalRecord>(journal.all()));
    if (session < 3) {
      EXPECT_THROW(t.Run(), std::runtime_error) << "session " << session;
      continue;
    }
    t.Run();
    ASSERT_EQ(t.trials().size(), 4u);
    EXPECT_EQ(t.trials()[2].result.status(), pb::WORKER_LOST);
    EXPECT_EQ(t.trials()[2].attempts, 3);
    EXPECT_EQ(t.state().failures(t.trials()[2].candidate), 1);
  }
  // With one death, the retry succeeds and the study equals an undisturbed one.
  MemoryJournal once, clean;
  DyingBackend dies_once(replay, 1);
  for (int session = 0; session < 2; ++session) {
    Tuner t(*f.c.candidates, f.searcher, f.Settings(), few, once, dies_once);
    t.Replay(std::vector<pb::JournalRecord>(once.all()));
    if (session == 0) {
      EXPECT_THROW(t.Run(), std::runtime_error);
    } else {
      t.Run();
      Tuner u(*f.c.candidates, f.searcher, f.Settings(), few, clean, replay);
      u.Run();
      EXPECT_EQ(Specs(t), Specs(u));
      EXPECT_EQ(t.trials()[2].attempts, 2);
    }
  }
}

class NanBackend : public TrialBackend {
 public:
  explicit NanBackend(double step_time_s = std::nan(""), double peak_memory_gib = 0)
      : step_time_s_(step_time_s), peak_memory_gib_(peak_memory_gib) {}
  std::string name() const override { return "nan"; }
  pb::ProbeRecorded Probe() override {
    pb::ProbeRecorded p;
    pb::ProbeRecorded::Feature* f = p.add_features();
    f->set_feature("tp_comm");
    f->add_ratios(1.5);
    return p;
  }
  pb::TrialResult Run(const pb::TrialRequest&) override {
    pb::TrialResult r;
    r.set_status(pb::OK);
    r.set_step_time_s(step_time_s_);
    r.set_peak_memory_gib(peak_memory_gib_);
    return r;
  }

 private:
  double step_time_s_, peak_memory_gib_;
};

TEST(Tuner, NonFiniteResultsBecomeNonfiniteTrialsAndProbeTightensThePrior) {
  Fixture f;
  MemoryJournal journal;
  NanBackend backend;
  TunerOptions few = f.options;
  few.stop.max_trials = 3;
  Tuner t(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
  t.Run();
  for (const TrialRecord& r : t.trials()) EXPECT_EQ(r.result.status(), pb::NONFINITE);
  EXPECT_GT(t.state().time().mean()[kTpComm], 1.2);
  EXPECT_EQ(t.state().measured_count(), 0);
}

// Issue 17: a trial that reports an absurd measurement (1e308 s overflowed the posterior's sums
// and aborted the tuner) is a nonfinite trial, and its peak is no peak: neither reaches the
// posterior, and the search goes on to its stop rule.
TEST(Tuner, AbsurdMeasurementsAreNonfiniteAndNeverReachThePosterior) {
  for (const double bad : {1e308, HUGE_VAL, -HUGE_VAL, std::nan(""), -1.0, 0.0, 1e-300, 2e6}) {
    Fixture f;
    MemoryJournal journal;
    NanBackend backend(bad, bad);
    TunerOptions few = f.options;
    few.stop.max_trials = 3;
    Tuner t(*f.c.candidates, f.searcher, f.Settings(), few, journal, backend);
    EXPECT_NO_THROW(t.Run()) << bad;
    ASSERT_EQ(t.trials().size(), 3u) << bad;
    for (const TrialRecord& r : t.trials()) {
      EXPECT_EQ(r.result.status(), pb::NONFINITE) << bad;
      EXPECT_EQ(r.result.peak_memory_gib(), 0) << bad;
      EXPECT_EQ(r.result.message().find("nan"), std::string::npos) << r.result.message();
      EXPECT_EQ(r.result.message().find("inf"), std::string::npos) << r.result.message();
    }
    EXPECT_EQ(t.state().measured_count(), 0) << bad;
  }
}

// The probe's measured non-tensor memory moves the memory prior's offset by what the analytic
// peak did not already count, and a resumed study gets the same prior from the journal.
class OverheadProbe : public TrialBackend {
 public:
  OverheadProbe(TrialBackend& inner, double non_tensor_gib)
      : inner_(inner), non_tensor_gib_(non_tensor_gib) {}
  std::string name() const override { return "overhead"; }
  pb::ProbeRecorded Probe() override {
    pb::ProbeRecorded p;
    p.set_non_tensor_gib(non_tensor_gib_);
    return p;
  }
  pb::TrialResult Run(const pb::TrialRequest& request) override { return inner_.Run(request); }

 private:
  TrialBackend& inner_;
  double non_tensor_gib_;
};

TEST(Tuner, MeasuredNonTensorMemoryShiftsTheMemoryPrior) {
  Fixture f;
  ReplayBackend replay(f.table);
  search::SearchSettings settings = f.Settings();
  settings.modelled_non_tensor_gib = 1.0;
  const double nominal = f.c.candidates->nominal_memory_gib(0);
  // The prior alone (the probe record, as a resumed study reads it from the journal): the
  // offset is the measured 3 GiB less the 1 GiB the analytic peak already counts.
  auto prior_mean = [&](double non_tensor_gib) {
    OverheadProbe backend(replay, non_tensor_gib);
    MemoryJournal journal;
    Tuner t(*f.c.candidates, f.searcher, settings, f.options, journal, backend);
    pb::JournalRecord probe;
    *probe.mutable_probe() = backend.Probe();
    t.Replay({probe});
    return t.state().memory().PredictMean({nominal});
  };
  EXPECT_NEAR(prior_mean(3.0) - prior_mean(0.0), 2.0, 1e-9);
  EXPECT_NEAR(prior_mean(0.0), nominal, 1e-9);  // unmeasured: the analytic peak as it is
}

// A study whose journal lost a result in the middle (docs/journal.md §9): the salvaged records
// replay (the records after the damage without the proposal and digest checks, which they no
// longer pass), the lost trial runs first, the study goes on to a stop, and the salvaged journal
// then resumes like any other.
TEST(Tuner, ASalvagedJournalReplaysAndRunsTheLostTrialAgain) {
  Fixture f;
  const std::string path = ::testing::TempDir() + "tuner_salvage_" + std::to_string(::getpid());
  std::remove(path.c_str());
  std::remove((path + ".corrupt-1").c_str());
  ReplayBackend backend(f.table);
  TunerOptions few = f.options;
  few.stop.max_trials = 8;
  few.stop.min_measured = 1000;  // max_trials decides
  std::vector<pb::JournalRecord> written;
  {
    FileJournal::Opened j = FileJournal::Open(path);
    Tuner live(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
    live.Run();
    written = FileJournal::Open(path).records;
  }
  // Flip a bit in the payload of trial 3's result.
  size_t lost = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    if (written[i].has_trial_finished() && written[i].trial_finished().result().trial_index() == 3)
      lost = i;
  }
  ASSERT_GT(lost, 0u);
  std::string bytes = ReadFile(path);
  size_t offset = kJournalHeaderBytes;
  for (size_t i = 0; i < lost; ++i) offset += FrameRecord(written[i], 0).size();
  bytes[offset + kFrameHeaderBytes + 3] ^= 0x20;
  WriteFileAtomic(path, bytes);
  EXPECT_THROW(FileJournal::Open(path), JournalCorrupt);

  FileJournal::Opened j = FileJournal::Open(path, JournalRecovery::kSalvage);
  {
    Tuner strict(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
    EXPECT_THROW(strict.Replay(j.records), StudyError);  // why the checks must be relaxed
  }
  Tuner salvaged(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
  salvaged.Replay(j.records, j.checked_records);
  EXPECT_EQ(salvaged.trials().size(), 7u);  // every result but the lost one
  const std::string lost_spec = written[lost].trial_finished().result().spec();
  few.stop.max_trials = 10;
  Tuner resumed(*f.c.candidates, f.searcher, f.Settings(), few, *j.journal, backend);
  resumed.Replay(j.records, j.checked_records);
  resumed.Run();
  ASSERT_EQ(resumed.trials().size(), 10u);
  EXPECT_EQ(resumed.trials()[7].result.spec(), lost_spec);  // the lost trial, first
  j.journal.reset();
  FileJournal::Opened again = FileJournal::Open(path);
  Tuner later(*f.c.candidates, f.searcher, f.Settings(), few, *again.journal, backend);
  EXPECT_NO_THROW(later.Replay(again.records, again.checked_records));
  EXPECT_EQ(later.state().Digest(), resumed.state().Digest());
  std::remove(path.c_str());
  std::remove((path + ".corrupt-1").c_str());
}

}  // namespace
}  // namespace autopar::coord
