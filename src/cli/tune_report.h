// The outputs of `tune` (docs/cli.md §6, docs/journal.md §1): the progress line per trial, result.json, trials.csv and
// the final table. Internal to src/cli (tune.cc is the only user).
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "autopar/cli/inputs.h"
#include "autopar/coord/replay.h"
#include "autopar/coord/status_server.h"
#include "autopar/coord/tuner.h"
#include "autopar/perf/cost_model.h"
#include "autopar/search/state.h"
#include "proto/autopar.pb.h"

namespace autopar::cli {

struct TuneFlags {
  std::string study;
  bool resume = false;
  bool salvage = false;  // --salvage (with --resume): keep every valid record of a corrupt journal
  std::optional<uint64_t> seed;  // unset: 0 for a new study, the study's own when resuming
  std::string backend;
  device::P2PSemantics p2p_semantics = device::P2PSemantics::kMpi;
  std::optional<std::string> replay_table;
  std::string searcher;
  double max_p_oom = search::kDefaultMaxPOom;
  int64_t top = 10;
  bool quiet = false;
  // The live status endpoint (rank 0): --status-addr, --status-port (0 picks a free port;
  // -1: off). On by default on 127.0.0.1:8642 for real backends, off for replay.
  std::string status_addr = "127.0.0.1";
  int status_port = -1;
  coord::TunerOptions tuner;
  // --backend megatron: --train-command's words and --real-data (docs/cli.md §6).
  std::vector<std::string> train_command;
  bool real_data = false;
};

struct TuneReport {
  const Inputs& in;
  const CostModel& model;
  const search::CandidateSet& candidates;
  const coord::Tuner& tuner;
  const coord::TuneSummary& summary;
  const pb::StudyDescription& study;
  const TuneFlags& flags;
  const coord::ReplayTable* table;  // with --backend replay
};

std::string ResultJson(const TuneReport& r);
std::string TrialsCsv(const TuneReport& r);
// The final output on stdout in --format: table, json (result.json), csv (trials.csv), megatron
// (best.args), yaml.
void WriteFinal(std::ostream& out, const TuneReport& r);

// One line per trial on stderr: index, config, measured vs predicted, best so far, elapsed, ETA.
// On a terminal (`tty`) the progress is one line updated in place (trial index, the
// configuration running, best so far, ETA); otherwise one plain line per trial.
class ProgressPrinter : public coord::TunerObserver {
 public:
  ProgressPrinter(std::ostream& err, const search::CandidateSet& candidates,
                  const coord::TunerOptions& options, bool quiet, bool tty = false)
      : err_(err), candidates_(candidates), options_(options), quiet_(quiet), tty_(tty) {}
  void OnTrialStarted(const pb::TrialStarted& started, const search::SearchState& state) override;
  void OnTrialFinished(const coord::TrialRecord& record, const search::SearchState& state) override;
  void OnStopped(const search::StopCheck& check, const search::SearchState& state) override;

 private:
  std::ostream& err_;
  const search::CandidateSet& candidates_;
  const coord::TunerOptions& options_;
  bool quiet_;
  bool tty_;
  std::string last_line_;
  int64_t session_trials_ = 0;   // this session's trials, for the mean trial time
  double session_start_s_ = -1;  // study time before this session's first trial
};

// Keeps the live status board of the status server current; forwards every event to `next`.
class StatusObserver : public coord::TunerObserver {
 public:
  StatusObserver(coord::TunerObserver& next, coord::StatusBoard& board,
                 const search::CandidateSet& candidates, const coord::TunerOptions& options,
                 coord::StatusSnapshot base)
      : next_(next), board_(board), candidates_(candidates), options_(options),
        snapshot_(std::move(base)) {
    board_.Update(snapshot_);
  }
  void OnTrialStarted(const pb::TrialStarted& started, const search::SearchState& state) override;
  void OnStopCheck(const search::StopCheck& check, const search::SearchState& state) override;
  void OnTrialFinished(const coord::TrialRecord& record, const search::SearchState& state) override;
  void OnStopped(const search::StopCheck& check, const search::SearchState& state) override;

 private:
  void Publish(const search::SearchState& state);
  coord::TunerObserver& next_;
  coord::StatusBoard& board_;
  const search::CandidateSet& candidates_;
  const coord::TunerOptions& options_;
  coord::StatusSnapshot snapshot_;
};

}  // namespace autopar::cli
