#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/coord/fake_channel.h"
#include "autopar/coord/files.h"
#include "autopar/coord/protocol.h"
#include "autopar/coord/replay.h"
#include "autopar/coord/tuner.h"
#include "search_test_util.h"

namespace autopar::coord {
namespace {

// A worker whose trial takes (1 + rank/10) s per iteration, with iteration 2 slow on rank 1; one
// rank can be told to run out of memory.
class FakeRunner : public RankRunner {
 public:
  FakeRunner(int rank, int oom_rank) : rank_(rank), oom_rank_(oom_rank) {}
  pb::HostFacts Facts() override {
    pb::HostFacts f;
    f.set_hostname("node" + std::to_string(rank_ / 2));
    f.set_local_rank(rank_ % 2);
    f.set_device("cpu");
    f.set_device_memory_gib(16);
    return f;
  }
  pb::ProbeResult Probe(const pb::ProbeRequest&) override {
    pb::ProbeResult p;
    p.set_status(pb::OK);
    pb::ProbeMeasurement* m = p.add_measurements();
    m->set_name("gemm_4096");
    m->set_feature("gemm");
    m->set_predicted_s(1.0);
    m->set_measured_s(1.0 + 0.1 * rank_);
    return p;
  }
  pb::RankTrialResult RunTrial(const pb::TrialRequest& request) override {
    ++trials;
    pb::RankTrialResult r;
    if (rank_ == oom_rank_) {
      r.set_status(pb::OOM);
      r.set_message("cudaMalloc failed");
      return r;
    }
    // Peers of an OOM rank see their collective aborted.
    r.set_status(oom_rank_ >= 0 ? pb::COMM_ERROR : pb::OK);
    for (int i = 0; i < request.timed_iterations(); ++i) {
      r.add_iteration_times_s(1.0 + rank_ / 10.0 + (rank_ == 1 && i == 2 ? 5.0 : 0.0));
    }
    r.set_peak_memory_gib(10 + rank_);
    return r;
  }
  int trials = 0;

 private:
  int rank_, oom_rank_;
};

struct Cluster {
  FakeChannelHub hub;
  std::vector<std::unique_ptr<FakeRunner>> runners;
  std::vector<std::thread> workers;
  Cluster(int world, int oom_rank, uint64_t fingerprint, uint64_t odd_fingerprint = 0)
      : hub(world) {
    for (int r = 0; r < world; ++r) runners.push_back(std::make_unique<FakeRunner>(r, oom_rank));
    for (int r = 1; r < world; ++r) {
      const uint64_t f = r == world - 1 && odd_fingerprint ? odd_fingerprint : fingerprint;
      workers.emplace_back([this, r, f] {
        try {
          RunWorkerLoop(hub.endpoint(r), *runners[r], f);
        } catch (const ChannelError&) {
          // the hub was closed under us: how a test ends a worker it abandoned
        }
      });
    }
  }
  ~Cluster() {
    hub.Close();
    for (std::thread& t : workers) t.join();
  }
};

pb::TrialRequest Request(int64_t index) {
  pb::TrialRequest q;
  q.set_trial_index(index);
  q.set_attempt(1);
  q.set_spec("tp=2,pp=2");
  q.set_timed_iterations(5);
  return q;
}

TEST(Protocol, StartUpProbeTrialShutdown) {
  Cluster c(4, /*oom_rank=*/-1, 77);
  ChannelBackend backend(c.hub.endpoint(0), *c.runners[0], {2, 2, 77, {}});
  ASSERT_EQ(backend.hosts().size(), 4u);
  EXPECT_EQ(backend.hosts()[3].hostname(), "node1");
  EXPECT_EQ(backend.hosts()[3].rank(), 3);

  const pb::ProbeRecorded probe = backend.Probe();
  ASSERT_EQ(probe.features_size(), 1);
  EXPECT_EQ(probe.features(0).feature(), "gemm");
  ASSERT_EQ(probe.features(0).ratios_size(), 1);
  EXPECT_NEAR(probe.features(0).ratios(0), 1.15, 1e-12);  // median over ranks of 1.0 .. 1.3

  const pb::TrialResult r = backend.Run(Request(7));
  EXPECT_EQ(r.status(), pb::OK);
  EXPECT_EQ(r.trial_index(), 7);
  // Max over ranks per iteration (rank 3: 1.3 s; 6.1 s once on rank 1), median over iterations.
  EXPECT_NEAR(r.step_time_s(), 1.3, 1e-12);
  EXPECT_NEAR(r.peak_memory_gib(), 13, 1e-12);
  EXPECT_EQ(r.failed_rank(), -1);
  for (const auto& runner : c.runners) EXPECT_EQ(runner->trials, 1);

  backend.Shutdown("done");
  for (std::thread& t : c.workers) t.join();
  c.workers.clear();
}

TEST(Protocol, OomOnOneRankIsTheRootCause) {
  Cluster c(4, /*oom_rank=*/2, 5);
  ChannelBackend backend(c.hub.endpoint(0), *c.runners[0], {1, 4, 5, {}});
  const pb::TrialResult r = backend.Run(Request(0));
  EXPECT_EQ(r.status(), pb::OOM);
  EXPECT_EQ(r.failed_rank(), 2);
  EXPECT_NE(r.message().find("cudaMalloc"), std::string::npos);
  backend.Shutdown("done");
}

TEST(Protocol, WorldSizeMustMatchTheFlags) {
  Cluster c(4, -1, 5);
  EXPECT_THROW(ChannelBackend(c.hub.endpoint(0), *c.runners[0], {2, 4, 5, {}}), InputError);
}

TEST(Protocol, RanksWithOtherFlagsAreRefused) {
  Cluster c(3, -1, 5, /*odd_fingerprint=*/6);
  EXPECT_THROW(ChannelBackend(c.hub.endpoint(0), *c.runners[0], {1, 3, 5, {}}), StudyError);
}

TEST(Protocol, MergeHandlesBrokenReports) {
  std::vector<pb::Report> reports(2);
  reports[0].mutable_trial()->set_status(pb::OK);
  reports[0].mutable_trial()->add_iteration_times_s(1.0);
  reports[1].mutable_trial()->set_status(pb::OK);  // no iterations
  EXPECT_EQ(MergeRankResults(Request(0), reports).status(), pb::NONFINITE);
  reports[1].mutable_trial()->add_iteration_times_s(std::nan(""));
  EXPECT_EQ(MergeRankResults(Request(0), reports).status(), pb::NONFINITE);
  reports[1].clear_trial();
  EXPECT_THROW(MergeRankResults(Request(0), reports), ChannelError);
  std::vector<pb::Report> unset(1);
  unset[0].mutable_trial();  // a worker that set no status
  EXPECT_EQ(MergeRankResults(Request(0), unset).status(), pb::INVALID);
}

TEST(Protocol, ALostChannelThrows) {
  FakeChannelHub hub(2);
  hub.Close();
  pb::Command command;
  EXPECT_THROW(hub.endpoint(1).Broadcast(&command), ChannelError);
}

}  // namespace
}  // namespace autopar::coord

namespace autopar::coord {
namespace {

// Every rank answers from the same replay table; rank r is 1% faster per rank, so the merged step
// time (max over ranks) is the table's.
class TableRunner : public RankRunner {
 public:
  TableRunner(const ReplayTable& table, int rank) : backend_(table), rank_(rank) {}
  pb::HostFacts Facts() override { return {}; }
  pb::ProbeResult Probe(const pb::ProbeRequest&) override {
    pb::ProbeResult p;
    p.set_status(pb::OK);
    return p;
  }
  pb::RankTrialResult RunTrial(const pb::TrialRequest& request) override {
    const pb::TrialResult r = backend_.Run(request);
    pb::RankTrialResult out;
    out.set_status(r.status());
    for (int i = 0; i < request.timed_iterations(); ++i) {
      out.add_iteration_times_s(r.step_time_s() * (1 - 0.01 * rank_));
    }
    out.set_peak_memory_gib(r.peak_memory_gib() * (1 - 0.01 * rank_));
    return out;
  }

 private:
  ReplayBackend backend_;
  int rank_;
};

// The whole coordinator over the channel: start-up, probe, trials, shutdown, with four ranks on
// threads. It must make the same study as the in-process replay backend.
TEST(Protocol, TheTunerRunsOverTheChannel) {
  autopar::testing::Llama7bCase c;
  const ReplayTable table = MakeSyntheticTable(*c.candidates, SyntheticTruth{});
  search::ThompsonSearcher searcher;
  TunerOptions options;
  options.seed = 3;
  options.stop.min_measured = 8;

  MemoryJournal direct_journal;
  ReplayBackend direct(table);
  Tuner reference(*c.candidates, searcher, search::SearchSettings::Default(*c.candidates), options,
                  direct_journal, direct);
  reference.Run();

  const int world = 4;
  FakeChannelHub hub(world);
  std::vector<std::unique_ptr<TableRunner>> runners;
  runners.reserve(world);
  for (int r = 0; r < world; ++r) runners.push_back(std::make_unique<TableRunner>(table, r));
  std::vector<std::thread> workers;
  for (int r = 1; r < world; ++r) {
    workers.emplace_back([&, r] { RunWorkerLoop(hub.endpoint(r), *runners[r], 99); });
  }
  MemoryJournal journal;
  {
    ChannelBackend backend(hub.endpoint(0), *runners[0], {1, world, 99, {}});
    Tuner tuner(*c.candidates, searcher, search::SearchSettings::Default(*c.candidates), options,
                journal, backend);
    tuner.Run();  // ends with Shutdown: the workers' loops return
    ASSERT_EQ(tuner.trials().size(), reference.trials().size());
    for (size_t i = 0; i < tuner.trials().size(); ++i) {
      EXPECT_EQ(tuner.trials()[i].result.spec(), reference.trials()[i].result.spec());
      EXPECT_EQ(tuner.trials()[i].result.status(), reference.trials()[i].result.status());
      EXPECT_EQ(tuner.trials()[i].result.step_time_s(), reference.trials()[i].result.step_time_s());
    }
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace
}  // namespace autopar::coord
