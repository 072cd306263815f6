#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "autopar/perf/cost_model.h"
#include "autopar/space/config.h"
#include "autopar/trial/schedule.h"
#include "autopar/trial/trial.h"

namespace autopar::trial {
namespace {

using Op = PipelineOp;

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternates) {
  const std::vector<Op> ops = PipelineSchedule(4, 1, 0, 6);
  const std::vector<Op> want = {{Op::kForward, 0, 0},  {Op::kForward, 1, 0},  {Op::kForward, 2, 0},
                                {Op::kForward, 3, 0},  {Op::kBackward, 0, 0}, {Op::kForward, 4, 0},
                                {Op::kBackward, 1, 0}, {Op::kForward, 5, 0},  {Op::kBackward, 2, 0},
                                {Op::kBackward, 3, 0}, {Op::kBackward, 4, 0}, {Op::kBackward, 5, 0}};
  EXPECT_EQ(ops, want);
  // The last stage runs forward and backward back to back.
  const std::vector<Op> last = PipelineSchedule(4, 1, 3, 2);
  EXPECT_EQ(last, (std::vector<Op>{{Op::kForward, 0, 0}, {Op::kBackward, 0, 0},
                                   {Op::kForward, 1, 0}, {Op::kBackward, 1, 0}}));
}

TEST(PipelineSchedule, InFlightMicrobatchesMatchTheMemoryModel) {
  // 1F1B: stage i holds min(m, pp − i); interleaved adds (pp − 1)/(pp·v) of pp on stage 0
  // (Korthikanti et al. 2022) — in micro-batch chunks of 1/v of a stage: pp·v + pp − 1.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(MaxInFlight(PipelineSchedule(4, 1, rank, 8)), 4 - rank);
    EXPECT_EQ(MaxInFlight(PipelineSchedule(4, 1, rank, 2)), std::min(2, 4 - rank));
  }
  EXPECT_EQ(MaxInFlight(PipelineSchedule(4, 2, 0, 8)), 4 * 2 + 4 - 1);
  // The model's count on every stage, the last ones included (pp − (pp − 1)/v there), and where
  // m = pp runs every forward first.
  for (const int pp : {2, 3, 4, 8}) {
    for (const int vpp : {1, 2, 3, 4}) {
      for (const int m : {pp, 2 * pp, 3 * pp}) {
        ParallelConfig c;
        c.pp = pp;
        c.vpp = vpp;
        for (int rank = 0; rank < pp; ++rank) {
          EXPECT_DOUBLE_EQ(MicrobatchesInFlight(c, m, rank),
                           MaxInFlight(PipelineSchedule(pp, vpp, rank, m)) / double{1.0 * vpp})
              << "pp " << pp << " vpp " << vpp << " m " << m << " rank " << rank;
        }
      }
    }
  }
}

TEST(PipelineSchedule, SlotsBySizeKeepEachChunkSizeApart) {
  // A counted split's first stage, chunks of 0 (the embedding alone) and 1 layer: pp 2, vpp 2,
  // 8 micro-batches, 5 chunk forwards alive at most. Chunk 0 has 4 alive at its peak and chunk 1
  // 2, at other times: 6 slots, 2 of them of a layer (one pool for both sizes: 5 of a layer).
  const std::vector<PipelineOp> ops = PipelineSchedule(2, 2, 0, 8);
  EXPECT_EQ(MaxInFlight(ops), 5);
  EXPECT_EQ(SlotsBySize(ops, {0, 1}), (std::map<int64_t, int>{{0, 4}, {1, 2}}));
  EXPECT_EQ(SlotsBySize(ops, {1, 1}), (std::map<int64_t, int>{{1, MaxInFlight(ops)}}));
}

TEST(PipelineSchedule, InterleavedVisitsEveryChunkOnceInMegatronOrder) {
  const int pp = 2, vpp = 3, m = 4;
  const std::vector<Op> ops = PipelineSchedule(pp, vpp, 0, m);
  // The first forwards: micro-batches 0, 1 through chunk 0, then chunk 1, ...
  EXPECT_EQ(ops[0], (Op{Op::kForward, 0, 0}));
  EXPECT_EQ(ops[1], (Op{Op::kForward, 1, 0}));
  EXPECT_EQ(ops[2], (Op{Op::kForward, 0, 1}));
  std::set<std::tuple<int, int, int>> seen;
  std::map<std::pair<int, int>, int> forward_at;
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_TRUE(seen.insert({ops[i].kind, ops[i].microbatch, ops[i].chunk}).second);
    if (ops[i].kind == Op::kForward) forward_at[{ops[i].microbatch, ops[i].chunk}] = int(i);
    else EXPECT_LT(forward_at.at({ops[i].microbatch, ops[i].chunk}), int(i));
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(2 * m * vpp));
}

// Runs every rank's schedule with non-blocking sends and blocking receives, as the trial does,
// and checks that no combination deadlocks.
bool CompletesWithoutDeadlock(int pp, int vpp, int m) {
  std::vector<std::vector<Op>> ops(pp);
  for (int r = 0; r < pp; ++r) ops[r] = PipelineSchedule(pp, vpp, r, m);
  std::vector<size_t> next(pp, 0);
  std::set<std::tuple<int, int, int>> sent;  // (direction, microbatch, receiving stage)
  const int last = pp * vpp - 1;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      if (next[r] == ops[r].size()) continue;
      const Op& op = ops[r][next[r]];
      const int stage = op.chunk * pp + r;
      const bool fwd = op.kind == Op::kForward;
      const bool ready = fwd ? stage == 0 || sent.count({0, op.microbatch, stage})
                             : stage == last || sent.count({1, op.microbatch, stage});
      if (!ready) continue;
      if (fwd && stage < last) sent.insert({0, op.microbatch, stage + 1});
      if (!fwd && stage > 0) sent.insert({1, op.microbatch, stage - 1});
      ++next[r];
      progress = true;
    }
  }
  for (int r = 0; r < pp; ++r) {
    if (next[r] != ops[r].size()) return false;
  }
  return true;
}

TEST(PipelineSchedule, NoLayoutDeadlocks) {
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 9, 16}) EXPECT_TRUE(CompletesWithoutDeadlock(pp, 1, m)) << pp << " " << m;
    if (pp == 1) continue;
    for (int vpp : {2, 3, 4}) {
      for (int groups : {1, 2, 3}) {
        EXPECT_TRUE(CompletesWithoutDeadlock(pp, vpp, groups * pp)) << pp << " " << vpp;
      }
    }
  }
}

// Runs every rank's transfer groups under NCCL's rules: a rank runs one group at a time in order;
// the k-th send from a to b meets the k-th receive on b from a (no tags), and a transfer completes
// only when its partner is in the partner rank's running group. `matched` is false when a send
// meets a receive that expects other data (a different micro-batch, stage or direction).
struct NcclRun {
  bool completed = false;
  bool matched = true;
};
using Groups = std::vector<std::vector<PipelineTransfer>>;
NcclRun RunUnderNcclRules(const std::vector<Groups>& ranks) {
  const int pp = static_cast<int>(ranks.size());
  struct Where {
    int group, index;
  };
  // channel (from, to) → the k-th transfer's place on the sending and on the receiving side
  std::map<std::pair<int, int>, std::vector<Where>> sends, recvs;
  for (int r = 0; r < pp; ++r) {
    for (int g = 0; g < static_cast<int>(ranks[r].size()); ++g) {
      for (int i = 0; i < static_cast<int>(ranks[r][g].size()); ++i) {
        const PipelineTransfer& t = ranks[r][g][i];
        if (t.kind == PipelineTransfer::kSend) sends[{r, t.peer}].push_back({g, i});
        else recvs[{t.peer, r}].push_back({g, i});
      }
    }
  }
  NcclRun run;
  // partner[r][g][i] = (peer rank, group, index) of the transfer that meets ranks[r][g][i]
  std::map<std::tuple<int, int, int>, std::tuple<int, int, int>> partner;
  for (const auto& [channel, list] : sends) {
    const auto it = recvs.find(channel);
    const size_t n = it == recvs.end() ? 0 : it->second.size();
    if (n != list.size()) return run;  // a send without a receive never completes
    for (size_t k = 0; k < n; ++k) {
      const auto [from, to] = channel;
      const Where s = list[k], q = it->second[k];
      const PipelineTransfer& a = ranks[from][s.group][s.index];
      const PipelineTransfer& b = ranks[to][q.group][q.index];
      if (a.microbatch != b.microbatch || a.stage != b.stage || a.backward != b.backward) {
        run.matched = false;
      }
      partner[{from, s.group, s.index}] = {to, q.group, q.index};
      partner[{to, q.group, q.index}] = {from, s.group, s.index};
    }
  }
  std::vector<int> running(pp, 0);
  std::vector<std::vector<bool>> done(pp);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      if (running[r] == static_cast<int>(ranks[r].size())) continue;
      const auto& group = ranks[r][running[r]];
      done[r].resize(group.size(), false);
      for (int i = 0; i < static_cast<int>(group.size()); ++i) {
        if (done[r][i]) continue;
        const auto [peer, g, j] = partner.at({r, running[r], i});
        if (running[peer] != g) continue;
        done[r][i] = true;
        done[peer].resize(ranks[peer][g].size(), false);
        done[peer][j] = true;
        progress = true;
      }
      if (std::all_of(done[r].begin(), done[r].end(), [](bool d) { return d; })) {
        ++running[r];
        done[r].clear();
        progress = true;
      }
    }
  }
  run.completed = true;
  for (int r = 0; r < pp; ++r) run.completed &= running[r] == static_cast<int>(ranks[r].size());
  return run;
}

std::vector<Groups> Exchanges(int pp, int vpp, int m, bool grouped) {
  std::vector<Groups> ranks(pp);
  for (int r = 0; r < pp; ++r) {
    const Groups groups = PipelineExchanges(pp, vpp, r, PipelineSchedule(pp, vpp, r, m));
    if (grouped) {
      ranks[r] = groups;
      continue;
    }
    // Every transfer on its own, in the same order: a lone send after each op, a lone receive
    // before the next (what the trial did before grouping).
    for (const auto& group : groups) {
      for (const PipelineTransfer& t : group) ranks[r].push_back({t});
    }
  }
  return ranks;
}

TEST(PipelineExchanges, GroupsTheOutputSendWithTheNextInputReceive) {
  // pp = 2, rank 0, m = 2: F0 F1 B0 B1 (warm-up of 1).
  const Groups g = PipelineExchanges(2, 1, 0, PipelineSchedule(2, 1, 0, 2));
  using T = PipelineTransfer;
  ASSERT_EQ(g.size(), 5u);
  EXPECT_TRUE(g[0].empty());                                            // F0 embeds
  EXPECT_EQ(g[1], (std::vector<T>{{T::kSend, 1, 0, 1, false}}));        // F1 embeds
  EXPECT_EQ(g[2], (std::vector<T>{{T::kSend, 1, 1, 1, false},           // F1's output
                                  {T::kRecv, 1, 0, 0, true}}));         // B0's gradient
  EXPECT_EQ(g[3], (std::vector<T>{{T::kRecv, 1, 1, 0, true}}));
  EXPECT_TRUE(g[4].empty());
}

TEST(PipelineExchanges, NoLayoutDeadlocksUnderNcclRules) {
  for (int pp : {2, 3, 4, 5, 8}) {
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      const NcclRun run = RunUnderNcclRules(Exchanges(pp, 1, m, true));
      EXPECT_TRUE(run.completed) << "pp " << pp << " m " << m;
      EXPECT_TRUE(run.matched) << "pp " << pp << " m " << m;
    }
    for (int vpp : {2, 3, 4}) {
      for (int groups : {1, 2, 3}) {
        const NcclRun run = RunUnderNcclRules(Exchanges(pp, vpp, groups * pp, true));
        EXPECT_TRUE(run.completed) << "pp " << pp << " vpp " << vpp << " m " << groups * pp;
        EXPECT_TRUE(run.matched) << "pp " << pp << " vpp " << vpp << " m " << groups * pp;
      }
    }
  }
}

TEST(PipelineExchanges, LoneSendsAndReceivesDeadlockUnderNcclRules) {
  // The simulation can fail: the 1F1B steady state with ungrouped transfers is the deadlock
  // NCCL would hit (rank r sends activations while r + 1 sends gradients; neither receives).
  EXPECT_FALSE(RunUnderNcclRules(Exchanges(2, 1, 4, false)).completed);
  EXPECT_FALSE(RunUnderNcclRules(Exchanges(4, 2, 8, false)).completed);
  // Without a steady state (one micro-batch) there is nothing to cross.
  EXPECT_TRUE(RunUnderNcclRules(Exchanges(2, 1, 1, false)).completed);
}

TEST(StageLinks, VirtualStagesWrapAroundTheRanks) {
  const StageLinks first = LinksOf(4, 2, 0, 0);
  EXPECT_EQ(first.prev_rank, -1);
  EXPECT_EQ(first.next_rank, 1);
  const StageLinks wrap = LinksOf(4, 2, 3, 0);  // stage 3 feeds stage 4 = rank 0, chunk 1
  EXPECT_EQ(wrap.next_rank, 0);
  EXPECT_EQ(wrap.next_chunk, 1);
  const StageLinks end = LinksOf(4, 2, 3, 1);
  EXPECT_EQ(end.next_rank, -1);
  EXPECT_EQ(end.prev_rank, 2);
}

TEST(Timing, TrialMicrobatchesReachSteadyState) {
  EXPECT_EQ(TrialMicrobatches(4, 1, 64, 0), 8);   // 2·pp
  EXPECT_EQ(TrialMicrobatches(4, 1, 6, 0), 6);    // never more than the job has
  EXPECT_EQ(TrialMicrobatches(1, 1, 64, 0), 2);
  EXPECT_EQ(TrialMicrobatches(4, 2, 64, 0), 8);   // a multiple of pp for interleaving
  EXPECT_EQ(TrialMicrobatches(4, 2, 64, 5), 4);
}

TEST(Timing, ExtrapolationScalesThePipelineBySlots) {
  // 1F1B with pp = 4: slots m + 3. Timed with 8 of 64 micro-batches.
  EXPECT_DOUBLE_EQ(ExtrapolateStepTime(1.1, 0.5, 4, 1, 8, 64), 1.1 * 67 / 11 + 0.5);
  // Interleaved, v = 3: bubble (pp − 1)/v = 1.
  EXPECT_DOUBLE_EQ(ExtrapolateStepTime(0.9, 0.0, 4, 3, 8, 64), 0.9 * 65 / 9);
  // Running everything needs no extrapolation.
  EXPECT_DOUBLE_EQ(ExtrapolateStepTime(2.0, 0.25, 8, 1, 16, 16), 2.25);
}

TEST(Timing, MedianOfTheSlowestRank) {
  EXPECT_DOUBLE_EQ(MedianOfMax({{1, 3}, {2, 2}, {5, 1}}), 3);
  EXPECT_DOUBLE_EQ(MedianOfMax({{1}, {4}}), 2.5);
  EXPECT_DOUBLE_EQ(MedianOfMax({}), 0);
}

// The timed iterations are extended at the measured pace until they last min_timed_s.
TEST(Trial, ExtraTimedIterationsReachTheMinimumTime) {
  TrialOptions o;
  o.timed_iterations = 2;
  o.min_timed_s = 1.0;
  EXPECT_EQ(ExtraTimedIterations(0.2, o), 8);  // 0.1 s each: 10 in all
  EXPECT_EQ(ExtraTimedIterations(0.3, o), 5);  // 0.15 s each: ceil(0.7 / 0.15)
  EXPECT_EQ(ExtraTimedIterations(1.0, o), 0);  // long enough already
  EXPECT_EQ(ExtraTimedIterations(0.0, o), 0);  // nothing measured: nothing to scale
  o.min_timed_s = 0;
  EXPECT_EQ(ExtraTimedIterations(0.2, o), 0);  // not asked for
}

TEST(Trial, ExtraTimedIterationsStopAtTheCap) {
  TrialOptions o;
  o.timed_iterations = 3;
  o.min_timed_s = 1e6;
  EXPECT_EQ(ExtraTimedIterations(1e-9, o), kMaxTimedIterations - 3);  // no overflow either
  o.timed_iterations = kMaxTimedIterations;
  EXPECT_EQ(ExtraTimedIterations(0.1, o), 0);
}

}  // namespace
}  // namespace autopar::trial
