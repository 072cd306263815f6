// The coordinator/worker protocol (docs/protocol.md §1–§5), written against a small Channel interface so
// it runs over MPI under mpirun (MpiChannel, built with the trial runner) and over an in-process
// fake in unit tests (fake_channel.h), as horovod's Controller runs over MPI or Gloo.
//
// Rank 0 is the coordinator and also a worker; every rank runs the same binary with the same argv
// and derives the same study description from it. The steps:
//
//  a. Start-up. Rank 0 checks that the channel's world size equals nnodes × nproc-per-node
//     (a mismatch is a launch error: InputError naming --nnodes/--nproc-per-node), then
//     broadcasts Hello{world, nnodes, nproc, study fingerprint}. Every rank gathers its
//     HostFacts (host, pid, local rank, device, device memory, its own study fingerprint).
//     Rank 0 refuses to go on (StudyError) if any fingerprint differs: ranks launched with
//     different flags would run different trials.
//  b. Probe (a fresh study only; a resumed one reads the ratios from its journal). Rank 0
//     broadcasts ProbeRequest; every rank times its micro-benchmarks (GEMM and attention shapes,
//     collectives on its real groups) and gathers a ProbeResult; rank 0 reduces them to ratios
//     measured/predicted per feature (ProbeRatios) and the tuner journals them and tightens the
//     prior.
//  c. Trial, repeated. Rank 0 broadcasts TrialRequest{trial index, attempt, config, deadline};
//     every rank runs its part of the configuration's training step (its stage, its collectives)
//     under the deadline and gathers a RankTrialResult; rank 0 merges them (MergeRankResults):
//     the step time is the median over timed iterations of the max over ranks, the peak memory
//     the max over ranks, the status the root cause over ranks.
//  d. Shutdown. Rank 0 broadcasts Shutdown; RunWorkerLoop returns on every other rank.
//  e. Failure. A rank that dies takes the job down (Open MPI without ULFM); the supervisor
//     relaunches with --resume, the journal has the trial in flight, the tuner retries it up to
//     twice and then records it as worker_lost. A trial that fails without killing a rank (OOM,
//     timeout, NCCL error caught by the watchdog) is an outcome of step c, not a failure of the
//     protocol.
//
// Every Broadcast but Shutdown's is followed by exactly one Gather on every rank, so the two
// collectives stay matched whatever a command asks for.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "autopar/coord/backend.h"
#include "proto/autopar.pb.h"

namespace autopar::coord {

// A transport failure (a peer is gone, a message does not parse). Not a trial outcome.
class ChannelError : public std::runtime_error {
 public:
  explicit ChannelError(const std::string& message) : std::runtime_error(message) {}
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Collective. Rank 0 sends *command; every other rank receives into *command.
  virtual void Broadcast(pb::Command* command) = 0;
  // Collective. Every rank contributes `mine`; rank 0 receives world_size() reports in rank order
  // in *all (other ranks' *all is left empty).
  virtual void Gather(const pb::Report& mine, std::vector<pb::Report>* all) = 0;
};

// What one rank does for each command: implemented over src/trial by the trial runner.
class RankRunner {
 public:
  virtual ~RankRunner() = default;
  virtual pb::HostFacts Facts() = 0;
  virtual pb::ProbeResult Probe(const pb::ProbeRequest& request) = 0;
  // Runs this rank's part of the trial; failures are statuses (OOM, TIMEOUT, ...), not throws.
  virtual pb::RankTrialResult RunTrial(const pb::TrialRequest& request) = 0;
};

// Ranks other than 0: answer commands (steps a–c) until Shutdown (step d). `study_fingerprint`
// goes into this rank's HostFacts. Throws ChannelError.
void RunWorkerLoop(Channel& channel, RankRunner& runner, uint64_t study_fingerprint);

// Step c's merge on rank 0. `reports` are in rank order.
pb::TrialResult MergeRankResults(const pb::TrialRequest& request,
                                 const std::vector<pb::Report>& reports);

// Step b's reduction: per feature, the ratio measured/predicted of each benchmark (median over
// ranks per benchmark name).
pb::ProbeRecorded ProbeRatios(const std::vector<pb::Report>& reports);

// Rank 0's side of the protocol, as the tuner's TrialBackend. `local` runs rank 0's own share.
class ChannelBackend : public TrialBackend {
 public:
  struct Options {
    int64_t nnodes = 1;
    int64_t nproc_per_node = 1;
    uint64_t study_fingerprint = 0;
    pb::ProbeRequest probe;
  };
  // Step a. Throws InputError (world size), StudyError (fingerprints) or ChannelError.
  ChannelBackend(Channel& channel, RankRunner& local, Options options);

  std::string name() const override { return "channel"; }
  pb::ProbeRecorded Probe() override;                             // step b
  pb::TrialResult Run(const pb::TrialRequest& request) override;  // step c
  void Shutdown(const std::string& reason) override;              // step d
  const std::vector<pb::HostFacts>& hosts() const { return hosts_; }

 private:
  Channel& channel_;
  RankRunner& local_;
  Options options_;
  std::vector<pb::HostFacts> hosts_;
  bool shut_down_ = false;
};

}  // namespace autopar::coord
