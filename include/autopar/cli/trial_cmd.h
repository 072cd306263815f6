// `autopar-tune trial` and `autopar-tune probe`: commands that run on every rank under mpirun.
// Their flags are the flag table's (help.h; `autopar-tune trial --help`).
//
// trial --config SPEC: one timed trial of the configuration's real training step (docs/trial.md
// §1),
//   --nnodes × --nproc-per-node equal to the number of MPI ranks, --device-memory-gib the per-rank
//   budget. Rank 0 prints status, step time, per-iteration times, peak memory per rank and
//   tokens/s, next to the analytic model's prediction. Exit 0 when the trial's outcome is ok, 1 for
//   any other outcome (oom, timeout, ...), 2 for bad input.
// probe: micro-benchmarks of the GEMM and attention shapes and of the collectives on the groups the
//   space uses, each next to the analytic model's time for it: the low-fidelity data the tuner's
//   prior is tightened with.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace autopar::cli {

int RunTrialCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
int RunProbeCommand(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// Installs `tune --backend cpu|cuda`: the coordinator/worker protocol over MPI with real trials
// (src/cli/mpi_trial_backend.cc). A no-op in a build without the trial runner.
void RegisterMpiTrialBackends();

}  // namespace autopar::cli
