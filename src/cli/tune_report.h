// The outputs of `tune` (DESIGN §8): the progress line per trial, result.json, trials.csv and
// the final table. Internal to src/cli (tune.cc is the only user).
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "autopar/cli/inputs.h"
#include "autopar/coord/replay.h"
#include "autopar/coord/tuner.h"
#include "autopar/perf/cost_model.h"
#include "proto/autopar.pb.h"

namespace autopar::cli {

struct TuneFlags {
  std::string study;
  bool resume = false;
  std::optional<uint64_t> seed;  // unset: 0 for a new study, the study's own when resuming
  std::string backend;
  std::optional<std::string> replay_table;
  std::string searcher;
  double max_p_oom = 0.05;
  int64_t top = 10;
  bool quiet = false;
  coord::TunerOptions tuner;
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
class ProgressPrinter : public coord::TunerObserver {
 public:
  ProgressPrinter(std::ostream& err, const search::CandidateSet& candidates,
                  const coord::TunerOptions& options, bool quiet)
      : err_(err), candidates_(candidates), options_(options), quiet_(quiet) {}
  void OnTrialFinished(const coord::TrialRecord& record, const search::SearchState& state) override;
  void OnStopped(const search::StopCheck& check, const search::SearchState& state) override;

 private:
  std::ostream& err_;
  const search::CandidateSet& candidates_;
  const coord::TunerOptions& options_;
  bool quiet_;
  int64_t session_trials_ = 0;   // this session's trials, for the mean trial time
  double session_start_s_ = -1;  // study time before this session's first trial
};

}  // namespace autopar::cli
