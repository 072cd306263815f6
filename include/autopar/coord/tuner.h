// Tuner: the coordinator's loop (docs/search.md §6–§8, docs/journal.md §4, §7). Propose → journal "started" → run the trial on
// the backend → observe → journal "finished" (with the state's digest) → check the stop rules →
// repeat. It is the same loop for every backend and every searcher, and the only writer of the
// journal.
//
// Resume. Replay() feeds the journal's records back through the same Observe() calls, so the
// state afterwards equals the state of an uninterrupted run: the posterior, the failure counts,
// and so the next proposal. Replay checks this as it goes: each journaled proposal must be the one
// the searcher makes again, and each digest the one the state has again; a mismatch is a
// StudyError (the journal belongs to another study or another build). A trial that was started
// but not finished (the coordinator died inside it) is retried by Run() up to `max_retries` times
// and then recorded as worker_lost.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autopar/coord/backend.h"
#include "autopar/coord/journal.h"
#include "autopar/search/searcher.h"
#include "autopar/search/state.h"
#include "autopar/search/stop.h"

namespace autopar::coord {

struct TunerOptions {
  uint64_t seed = 0;
  search::StopSettings stop;
  int max_retries = 2;           // retries of a trial whose coordinator died inside it
  double trial_timeout_s = 600;  // the workers' watchdog limit per trial
  int warmup_iterations = 2;
  int timed_iterations = 5;
  double min_timed_s = 0.5;  // see trial::TrialOptions::min_timed_s
  // Real trials that take minutes (--backend megatron): the stop rule counts the next trial's
  // expected wall time (the median of the trials so far, start-up included) against --budget
  // (search::StopSettings::next_trial_s).
  bool reserve_trial_time = false;
};

// One finished trial, as the observer and the outputs see it.
struct TrialRecord {
  int64_t candidate = -1;
  int32_t attempts = 1;
  pb::TrialResult result;
  double predicted_step_time_s = 0;  // posterior mean when proposed
  double predicted_memory_gib = 0;
  double p_oom = 0;
  int64_t best_candidate = -1;  // the recommendation after this trial
  double best_step_time_s = 0;  // its estimated step time (SearchState::Estimated)
  double elapsed_s = 0;
};

class TunerObserver {
 public:
  virtual ~TunerObserver() = default;
  // Before the backend runs a trial (a retry of an interrupted one included).
  virtual void OnTrialStarted(const pb::TrialStarted& started, const search::SearchState& state) {
    (void)started;
    (void)state;
  }
  // After each check of the stop rules that did not stop the search.
  virtual void OnStopCheck(const search::StopCheck& check, const search::SearchState& state) {
    (void)check;
    (void)state;
  }
  virtual void OnTrialFinished(const TrialRecord& record, const search::SearchState& state) {
    (void)record;
    (void)state;
  }
  virtual void OnStopped(const search::StopCheck& check, const search::SearchState& state) {
    (void)check;
    (void)state;
  }
};

struct TuneSummary {
  search::StopCheck stop;
  double elapsed_s = 0;
  int32_t sessions = 0;
  std::vector<double> proposal_ms;    // this session's proposals
  std::vector<double> stop_check_ms;  // this session's stop checks
};

class Tuner {
 public:
  // `candidates`, `searcher`, `journal`, `backend` and `observer` (may be null) must outlive the
  // tuner. `settings` is completed by the probe's tightening before the state is built.
  Tuner(const search::CandidateSet& candidates, const search::Searcher& searcher,
        search::SearchSettings settings, TunerOptions options, JournalSink& journal,
        TrialBackend& backend, TunerObserver* observer = nullptr);

  // Rebuilds the state from a journal (before Run). Throws StudyError on a journal that does not
  // replay. Records from index `checked_records` on (those a salvage repaired, FileJournal::Opened)
  // replay without the proposal and digest checks: the records lost before them changed what the
  // searcher proposed and what the state holds (docs/journal.md §9).
  void Replay(const std::vector<pb::JournalRecord>& records,
              size_t checked_records = std::numeric_limits<size_t>::max());
  // Replay, and when the journal does not replay as this build runs the study (a study begun by
  // another build of autopar-tune whose searcher proposes otherwise or whose state digests
  // differ), replay every record again without those checks: the measurements are kept as
  // observations of this build's state (docs/journal.md §7). Returns the reason the checked
  // replay failed, empty when it did not. Only on a fresh tuner.
  std::string ReplayAcrossBuilds(const std::vector<pb::JournalRecord>& records,
                                 size_t checked_records);

  // Runs until a stop rule fires; returns why. Throws what the backend or the journal throw (the
  // journal then holds everything up to the failure).
  TuneSummary Run();

  // Valid after Replay() found a probe record, or once Run() started.
  const search::SearchState& state() const { return *state_; }
  bool has_state() const { return state_.has_value(); }
  const std::vector<TrialRecord>& trials() const { return trials_; }
  // For tests: the clock Run() reads (seconds, monotonic).
  void set_clock(std::function<double()> now_s) { now_s_ = std::move(now_s); }

 private:
  struct InFlight {
    pb::TrialStarted started;
    int32_t attempts = 0;
  };
  void BuildState(const pb::ProbeRecorded& probe);
  pb::TrialStarted Propose(int64_t candidate);
  void Finish(pb::TrialResult result, double elapsed_s);
  // Run's pieces: the session record; the in-flight trial run on the backend (or, given up
  // after 1 + max_retries starts, recorded as WORKER_LOST); its result finished and journalled.
  void AppendSession();
  pb::TrialResult RunInFlight(bool give_up);
  void RecordFinished(const pb::TrialResult& result, double elapsed_s);
  void Append(const pb::JournalRecord& record);

  const search::CandidateSet& candidates_;
  const search::Searcher& searcher_;
  search::SearchSettings settings_;
  TunerOptions options_;
  JournalSink& journal_;
  TrialBackend& backend_;
  TunerObserver* observer_;
  std::function<double()> now_s_;

  std::optional<search::SearchState> state_;
  std::optional<InFlight> in_flight_;
  std::vector<TrialRecord> trials_;
  double elapsed_base_s_ = 0;  // tuning time of earlier sessions
  int32_t sessions_ = 0;
};

}  // namespace autopar::coord
