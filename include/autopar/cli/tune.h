// `autopar-tune tune` (the default command) and `autopar-tune make-replay-table` (docs/cli.md §6,
// §9). Their flags are the flag table's (help.h; `autopar-tune tune --help`).
//
// tune: the online search. Reads the planning inputs (model, train, cluster, space) and its own
// flags, prints a progress line per trial on stderr and the final table (or --format) on stdout,
// and writes DIR/result.json, DIR/trials.csv and DIR/best.args atomically. Exit codes: 0 ok, 1
// I/O or backend failure, 2 bad input, 3 no configuration could be measured, 4 study locked or
// mismatched.
//
// make-replay-table: enumerates the space with the analytic model and writes a synthetic replay
// table whose truth is the model mis-specified (coord::SyntheticTruth), or a world built on it
// (coord::WorldFamily, worlds.h).
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "autopar/cli/inputs.h"
#include "autopar/coord/backend.h"
#include "autopar/search/candidates.h"
#include "proto/autopar.pb.h"

namespace autopar::cli {

int RunTune(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
int RunMakeReplayTable(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// What a real trial backend is built from. `study` is the description derived from the flags
// (every rank derives the same one; coord::Fingerprint(study) is what the ranks compare).
struct TuneContext {
  const Inputs& inputs;
  const pb::StudyDescription& study;
  const search::CandidateSet& candidates;
  std::string backend;  // "cpu", "cuda" or "megatron"
  device::P2PSemantics p2p_semantics = device::P2PSemantics::kMpi;
  double trial_timeout_s = 600;
  int warmup_iterations = 2;
  int timed_iterations = 5;
  // --backend megatron (docs/trial.md §17): the study directory (each rank's logs go under
  // STUDY/trials/N/), --train-command's words, the user's Megatron-LM arguments (the words of
  // --megatron-args or --megatron-args-file) and --real-data.
  std::string study_dir;
  std::vector<std::string> train_command;
  std::vector<std::string> megatron_args;
  bool real_data = false;
};

// Builds the backend of `--backend NAME` on this rank. On rank 0 it returns the coordinator's
// backend (e.g. coord::ChannelBackend over the MPI channel, after start-up). On every other rank
// it runs coord::RunWorkerLoop to its end and returns nullptr: RunTune then returns 0 without
// touching the study directory, which belongs to rank 0.
using TrialBackendFactory =
    std::function<std::unique_ptr<coord::TrialBackend>(const TuneContext& context)>;

// Installs the factory for `--backend cpu` or `--backend cuda`. Without one those backends exit
// with code 2 and say they need the MPI launcher. Call before Main() (not thread-safe).
void RegisterTrialBackend(const std::string& name, TrialBackendFactory factory);

}  // namespace autopar::cli
