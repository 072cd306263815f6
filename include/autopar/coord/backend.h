// TrialBackend: how the tuner's loop gets a configuration measured. The loop (tuner.h) knows
// nothing else about trials.
//
//   ReplayBackend  (replay.h)    answers from a table, in one process (benchmarks, CI);
//   ChannelBackend (protocol.h)  runs the trial on every rank over a Channel (MPI under mpirun).
#pragma once

#include <string>

#include "proto/autopar.pb.h"

namespace autopar::coord {

// The measurements the search takes (docs/search.md §2): a step time and a peak memory within
// these bounds. Past them the posterior's log-domain sums overflow or describe no training run:
// the tuner records a trial that reports one as `nonfinite` (never fed to the posterior), and a
// replay table that holds one is refused naming its line and column.
inline constexpr double kMinStepTimeS = 1e-9;
inline constexpr double kMaxStepTimeS = 1e6;  // 11.6 days per step
inline constexpr double kMinPeakMemoryGib = 1e-9;
inline constexpr double kMaxPeakMemoryGib = 1e6;  // 1 PiB per GPU

class TrialBackend {
 public:
  virtual ~TrialBackend() = default;
  virtual std::string name() const = 0;

  // The start-up micro-benchmarks as measured/predicted ratios per feature (pb::ProbeRecorded
  // is what the journal keeps, so a resumed study tightens its prior identically without probing
  // again). Empty when the backend has no probe (replay).
  virtual pb::ProbeRecorded Probe() = 0;

  // Runs one trial to completion and returns the merged result, whose trial_index, attempt and
  // spec echo the request. A failing trial is an outcome (status), not an exception; throw only
  // when the backend itself is unusable (a lost channel): the tuner then stops with the trial
  // still in flight in the journal, and `--resume` retries it.
  virtual pb::TrialResult Run(const pb::TrialRequest& request) = 0;

  // Releases the workers (their loop returns). Idempotent: the tuner calls it when the search
  // ends, and the CLI once more on whatever path leaves the command.
  virtual void Shutdown(const std::string& reason) { (void)reason; }
};

}  // namespace autopar::coord
